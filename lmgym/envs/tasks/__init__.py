"""Built-in tasks, each registered as ``lmgym/<Name>-v0`` (see ``lmgym.envs.registration``)."""
