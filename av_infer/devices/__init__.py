"""av_infer.devices"""
