"""Checking a running engine's answers against a float32 reference by log-probabilities, never by greedy text.

The reference (`backend.child.logprob_reference`, HF transformers in float32 on the same weights) holds, for a fixed
set of chat prompts, a greedy continuation and the top-k log-probabilities at each of its positions. The engine
is fed the same token ids (teacher forcing) and must agree within a tolerance measured for the numeric format it
computes in. Greedy text is useless for this: a small model's first token sits on near ties that flip from one
CPU to the next. The check also renders the reference's messages with the engine's own chat template: a wrong
template gives other token ids, which the log-probabilities of fixed ids cannot show.

reference.py: the reference file; tolerance.py: how far each number format may be; comparison.py: the verdict
(pure); check.py: asking a running engine (through its dialect, backend.engines); command.py: `check-answers`.
"""
