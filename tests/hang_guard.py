"""How long a call that must fail fast may take before a test calls it a hang.

Not a speed target (those are benchmarks): the failures these guards catch are retry loops of a
minute or more (the official client's ~61 s of retries, pyspark's Spark Connect client's ~10 min),
so the bound sits well below them and far above what a loaded 2-core machine takes for a failure
that really is fast: a CI run with both suite parts and the interpreter tiers runs at a load of
15 or more, where a Spark listing alone can take ten seconds."""

HANG_GUARD_S = 45.0
