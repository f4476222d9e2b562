"""What the host machine grants a run: its memory budget (:mod:`.memory`) and JAX's persistent
compilation cache (:mod:`.compile_cache`)."""
