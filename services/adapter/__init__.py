"""The inference worker's Redis adapter around the engine (entry point: ``services.inference_worker``).

- ``stream``: the inference stream's consumer group (read, claim, renew, ack).
- ``store``: job records: load, attempts, tensors, dead letters.
- ``requests``: JobSpec -> engine GenerationRequest.
- ``events``: the writer thread: token events, terminal state, session, result cache, XACK.
- ``runner``: the main loop (read, submit, cancel polling, heartbeat, shutdown).
"""
