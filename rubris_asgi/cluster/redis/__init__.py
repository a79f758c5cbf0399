"""cluster/redis"""
