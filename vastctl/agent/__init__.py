"""agent-step: the strategist that keeps the fleet sized to the demand (rules.py and what it sizes and values by, step.py; llm.py, memory.py)."""
