"""av_infer.bench"""
