"""The inference worker: the Redis side around the engine (``python -m services.inference_worker``).

- ``loop``: the main loop (read, submit, cancel polling, heartbeat, renew, shutdown).
- ``stream_consumer``: the inference stream's consumer group (read, claim, renew owned entries, ack).
- ``job_store``: job records: begin an attempt, tensors, fenced status/finish writes, dead letters.
- ``engine_request``: JobSpec -> engine GenerationRequest.
- ``job_run``: ``JobRun`` (one attempt on this worker) and how an attempt ends.
- ``event_writer``: the writer thread: token events and terminal state (build -> execute -> apply).
- ``after_finish``: after the terminal state: conversation, result cache, metrics, XACK.
- ``engine_setup``: the engine built from the worker's settings.
"""
