//! Who holds the webhook senders: the deliveries in flight, by endpoint and by tenant, and
//! whether one more may start. An endpoint has at most one delivery in flight, a tenant at
//! most `senders_per_tenant`, and all of them together at most `senders`; so a tenant whose
//! endpoints hang (accept and never answer) holds its share of the senders until its
//! attempts time out, and the other tenants' deliveries go out on the rest at once.
//!
//! Pure bookkeeping, owned by the `kestrel-webhooks` dispatcher thread (`deliver.rs`).

use std::collections::HashMap;

/// A delivery in flight: its endpoint and its tenant.
struct Holder {
    webhook: String,
    tenant: String,
}

pub(super) struct Shares {
    senders: usize,
    per_tenant: usize,
    /// By delivery id.
    in_flight: HashMap<String, Holder>,
    by_tenant: HashMap<String, usize>,
}

impl Shares {
    pub(super) fn new(senders: usize, per_tenant: usize) -> Shares {
        Shares { senders, per_tenant, in_flight: HashMap::new(), by_tenant: HashMap::new() }
    }

    /// Every sender has a delivery.
    pub(super) fn full(&self) -> bool {
        self.in_flight.len() >= self.senders
    }

    /// Whether a delivery of `webhook` (of `tenant`) may start now.
    pub(super) fn may_start(&self, delivery_id: &str, webhook: &str, tenant: &str) -> bool {
        !self.full()
            && !self.in_flight.contains_key(delivery_id)
            && !self.in_flight.values().any(|holder| holder.webhook == webhook)
            && self.by_tenant.get(tenant).copied().unwrap_or(0) < self.per_tenant
    }

    pub(super) fn start(&mut self, delivery_id: &str, webhook: &str, tenant: &str) {
        let holder = Holder { webhook: webhook.to_string(), tenant: tenant.to_string() };
        if self.in_flight.insert(delivery_id.to_string(), holder).is_none() {
            *self.by_tenant.entry(tenant.to_string()).or_insert(0) += 1;
        }
    }

    /// The delivery's attempt ended (recorded or not).
    pub(super) fn end(&mut self, delivery_id: &str) {
        let Some(holder) = self.in_flight.remove(delivery_id) else { return };
        if let Some(count) = self.by_tenant.get_mut(&holder.tenant) {
            *count -= 1;
            if *count == 0 {
                self.by_tenant.remove(&holder.tenant);
            }
        }
    }

    /// The endpoints with a delivery in flight.
    pub(super) fn busy_webhooks(&self) -> Vec<String> {
        self.in_flight.values().map(|holder| holder.webhook.clone()).collect()
    }

    /// Deliveries of one tenant in flight at most.
    pub(super) fn per_tenant(&self) -> usize {
        self.per_tenant
    }

    /// The tenant's deliveries in flight.
    pub(super) fn of_tenant(&self, tenant: &str) -> usize {
        self.by_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// The tenants with `level` deliveries in flight or more.
    pub(super) fn tenants_at(&self, level: usize) -> Vec<String> {
        self.by_tenant.iter().filter(|(_, count)| **count >= level).map(|(tenant, _)| tenant.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Shares;

    #[test]
    fn an_endpoint_takes_one_sender_a_tenant_its_share_and_all_of_them_the_senders() {
        let mut shares = Shares::new(4, 2);
        assert!(shares.may_start("d1", "a1", "a"));
        shares.start("d1", "a1", "a");
        assert!(!shares.may_start("d2", "a1", "a"), "one delivery at a time per endpoint");
        assert!(!shares.may_start("d1", "a2", "a"), "a delivery is in flight once");
        shares.start("d3", "a2", "a");
        assert!(!shares.may_start("d4", "a3", "a"), "the tenant has its share");
        assert_eq!((shares.tenants_at(shares.per_tenant()), shares.of_tenant("a")), (vec!["a".to_string()], 2));
        let mut busy = shares.busy_webhooks();
        busy.sort();
        assert_eq!(busy, ["a1", "a2"]);
        assert!(shares.may_start("d5", "b1", "b"), "another tenant has the rest");
        shares.start("d5", "b1", "b");
        let mut at_one = shares.tenants_at(1);
        at_one.sort();
        assert_eq!(at_one, ["a", "b"]);
        shares.start("d6", "c1", "c");
        assert!(shares.full());
        assert!(!shares.may_start("d7", "d1", "d"), "every sender is taken");
        shares.end("d1");
        assert!(shares.may_start("d2", "a1", "a"), "an ended delivery frees its endpoint and its share");
        assert!(shares.tenants_at(2).is_empty());
        shares.end("d1");
        assert!(shares.may_start("d2", "a1", "a"), "an end told twice counts once");
    }
}
