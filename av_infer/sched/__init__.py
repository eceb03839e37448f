"""av_infer.sched"""
