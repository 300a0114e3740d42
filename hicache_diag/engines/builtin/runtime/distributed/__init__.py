"""Mirrors sglang/srt/distributed."""
