"""agent-step: the strategist that keeps the fleet sized to the demand (rules.py, step.py; llm.py, memory.py)."""
