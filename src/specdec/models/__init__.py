"""Causal LM backends behind one protocol (``specdec.models.base.CausalLM``)."""
