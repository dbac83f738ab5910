"""Multi-turn tasks (issue 28): responders that answer the policy between its turns.

- ``safe_arith``: the calculator's arithmetic evaluator (never ``eval``).
"""
