"""av_infer.kernels"""
