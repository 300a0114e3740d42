"""Mirrors sglang/srt/model_executor/models."""
