"""The orchestration above the stages: the pipeline (`raybench grid`), the command line, Ray Jobs, cluster
wheels and exports.
"""
