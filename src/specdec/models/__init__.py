"""Causal LM backends behind one protocol (``specdec.core.model.CausalLM``)."""
