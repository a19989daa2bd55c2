-- Tenants (issue 45): a job made through `narrator serve`'s fleet gateway belongs to the
-- tenant of the token that asked for it; the gateway lists and shows a tenant only its
-- own. Jobs from `submit` and the RabbitMQ intake have none. The gateway's listing reads
-- a tenant's newest jobs first, with an optional state and voice.
ALTER TABLE jobs ADD COLUMN tenant text;
CREATE INDEX jobs_tenant_created ON jobs (tenant, created_at DESC, id) WHERE tenant IS NOT NULL;
