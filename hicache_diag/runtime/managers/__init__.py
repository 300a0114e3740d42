"""Mirrors sglang/srt/managers."""
