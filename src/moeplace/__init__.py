"""moeplace: where a llama.cpp MoE model's expert weights should live, predicted and measured."""

__version__ = "0.1.0"
