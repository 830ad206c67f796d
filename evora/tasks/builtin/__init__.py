"""The built-in tasks, one module each (families.py: three small ones); `evora.tasks` imports
every module here, which registers it."""
