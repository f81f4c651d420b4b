"""The domain: the job spec, its types and the task schema shared with jobs/; pure."""
