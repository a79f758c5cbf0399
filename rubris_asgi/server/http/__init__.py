"""server/http"""
