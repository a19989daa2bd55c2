-- Issue 14: the W3C trace context `narrator submit` started for a job, so that the
-- reconciler's republishes and the assembly join the job's trace. NULL when the job was
-- submitted without tracing.
ALTER TABLE jobs ADD COLUMN traceparent text, ADD COLUMN tracestate text;
