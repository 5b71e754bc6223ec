"""Decoding: beam search with its cache, the batched decoding library, oneDNN linear layers for x86
CPUs not made by Intel; nmt/translate.py is the entry point."""
