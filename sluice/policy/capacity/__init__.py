"""What tenants, workers and fleets may hold: tenant quotas and token buckets, model residency
under a memory budget, keep-alive and pinning, autoscaling."""
