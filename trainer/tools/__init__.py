"""Tools for multi-turn rollouts: the plug-in interface (:mod:`.base`), the call formats (:mod:`.formats`), the
dispatcher and its rules (:mod:`.toolbox`), the tools by name (:mod:`.registry`), and the built-in tools: search
(:mod:`.search`), a sandboxed Python interpreter (:mod:`.python` over :mod:`.sandbox`) and an HTTP service of
your own (:mod:`.http`). The turn loop that calls them is :mod:`trainer.rollout.multiturn`.

Nothing is imported here: each engine imports what its job's tools need.
"""
