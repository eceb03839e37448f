"""av_infer.model"""
