"""vlmq tests (a package, so test modules import as tests.<area>.<module> and never shadow the sources)."""
