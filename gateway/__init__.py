"""vlmq web gateway: validates requests, writes jobs to Redis, streams their events back."""
