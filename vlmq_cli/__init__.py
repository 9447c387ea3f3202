"""``vlmq``: the command line client of a vlmq service (HTTP only: it imports no other vlmq package).

    vlmq ask IMAGE "question"        stream the answer (--session ID for a follow-up, --json)
    vlmq jobs show|cancel ID         a job's state, or cancel it
    vlmq status                      queues, workers, cache hit ratios, recent latency
    vlmq dead-letters list|retry     operators' view of jobs failed for good
    vlmq bench                       load the service, with a progress bar and a results table

Base URL and key: ``--url`` / ``--key`` or ``VLMQ_URL`` / ``VLMQ_API_KEY``.
"""
