"""Multi-turn tasks (issue 28): responders that answer the policy between its turns.

Each module holds one job (see its docstring for prompts, observations, reward):

- ``guess_number``: ``GuessNumber``, higher / lower after each guess
  (``lmgym/GuessNumber-v0``);
- ``calculator``: ``Calculator``, a tool the policy calls with a tagged expression
  before it answers (``lmgym/Calculator-v0``), over ``safe_arith`` (never ``eval``),
  run as a tool (``tools``);
- ``gym_bridge``: ``GymResponder`` and ``TextGame``, any discrete Gymnasium env
  played as text, one move per turn;
- ``games``: the bridged FrozenLake, CliffWalking, Taxi and Blackjack
  (``lmgym/FrozenLake-v0``, ...);
- ``textarena_bridge``: ``TextArenaResponder``, a single-player TextArena game played
  live (``pip install 'lmgym[textarena]'``); ``textarena_games``: GuessTheNumber,
  Crosswords and TowerOfHanoi (``lmgym/TextArena-GuessTheNumber-v0``, ...);
- ``tools``: tools in the model's format: typed functions, their schemas rendered
  through the chat template's ``tools`` support (or a default format), calls
  parsed from the turn and run in a worker with a time and memory limit;
- ``weather``: ``Weather``, a typed tool that alone knows the answer
  (``lmgym/Weather-v0``);
- ``echo``: ``EchoTurn``, repeat the letter the environment said, the sanity task a
  tiny model learns (``lmgym/EchoTurn-v0``).

Responders are functional over an immutable per-episode state (``lmgym.envs.turns``).
"""
