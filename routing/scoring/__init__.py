"""Scoring answers: the scorers (numeric, exact, Python literal, math, regex) and the LLM judge.

Below the engine and used by it (a run's score, a cascade's judge) and by training (rewards, evaluations).
"""
