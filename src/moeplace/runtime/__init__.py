"""Machinery under every stage: processes, devices, llama.cpp builds and what they print, provenance, outputs.
Imports nothing of moeplace's above it (only moeplace.core)."""
