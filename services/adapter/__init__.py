"""The inference worker's Redis adapter around the engine (entry point: ``services.inference_worker``).

- ``stream``: the inference stream's consumer group (read, claim, renew owned entries, ack).
- ``store``: job records: load, attempts, tensors, fenced status/finish writes, dead letters.
- ``requests``: JobSpec -> engine GenerationRequest.
- ``lua``: the token-append script (fenced by attempt, idempotent by token index).
- ``run``: ``JobRun`` (one attempt on this worker) and how an attempt ends.
- ``writer``: the writer thread: token events and terminal state (build -> execute -> apply).
- ``finish``: after the terminal state: session, result cache, metrics, XACK.
- ``runner``: the main loop (read, submit, cancel polling, heartbeat, renew, shutdown).
"""
