"""Mirrors sglang/srt/mem_cache."""
