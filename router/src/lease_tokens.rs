//! Lease tokens the router hands out in place of a server's own (`lease-get` / `lease-set`).
//!
//! A client's `lease-set` carries back the token its `lease-get` was answered with. Two cases need
//! the router to remember where that token came from:
//! - pairing: a FailoverRoute with `enable_lease_pairing` that got the lease from a child other
//!   than its first must send the `lease-set` to that same child (the first one never issued it);
//! - collisions: a server's token (the item's CAS) of 0 or 1, or one that looks like a router
//!   token, cannot be given to the client as it is (1 means "hot miss" to lease clients).
//!
//! In both cases the client gets a router token instead: a fixed 32-bit tag in the high half and
//! a sequence number in the low half. An entry is keyed by the token and the name of the route
//! that made it, lives `ttl` at most, and is used once. No dependency on the rest of the crate.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tag in the high 32 bits of every router token.
const TAG: u64 = 0x5e4a_1ea5 << 32;
const TAG_MASK: u64 = 0xffff_ffff << 32;
/// How long a router token is honoured (the vivified item of a won lease is gone by then anyway).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// At most this many tokens are kept; the oldest go first.
const MAX_ENTRIES: usize = 1 << 20;

/// Where a router token leads: the token the server gave, and which child of the route issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Issued {
    pub original: u64,
    pub child: usize,
}

struct Entry {
    route: String,
    issued: Issued,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, Entry>,
    order: VecDeque<u64>,
    next: u32,
}

pub struct LeaseTokens {
    ttl: Duration,
    inner: Mutex<Inner>,
}

impl Default for LeaseTokens {
    fn default() -> Self {
        LeaseTokens::new(DEFAULT_TTL)
    }
}

impl LeaseTokens {
    pub fn new(ttl: Duration) -> Self {
        LeaseTokens {
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether a server's token cannot be handed to a client as it is.
    pub fn conflicts(token: u64) -> bool {
        token <= 1 || Self::is_router_token(token)
    }

    pub fn is_router_token(token: u64) -> bool {
        token & TAG_MASK == TAG
    }

    /// Remember `issued` for `route`; the token to give the client.
    pub fn insert(&self, route: &str, issued: Issued) -> u64 {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some(&old) = g.order.front() {
            let stale = g.map.get(&old).is_none_or(|e| now.duration_since(e.at) >= self.ttl);
            if !stale && g.map.len() < MAX_ENTRIES {
                break;
            }
            g.order.pop_front();
            g.map.remove(&old);
        }
        let token = TAG | u64::from(g.next);
        g.next = g.next.wrapping_add(1);
        g.map.insert(
            token,
            Entry {
                route: route.to_string(),
                issued,
                at: now,
            },
        );
        g.order.push_back(token);
        token
    }

    /// The entry `route` made for `token`, taken out (a token is used once); `None` for a token
    /// the router did not make for `route`, or one older than the ttl.
    pub fn take(&self, route: &str, token: u64) -> Option<Issued> {
        if !Self::is_router_token(token) {
            return None;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.map.get(&token)?.route != route {
            return None;
        }
        let e = g.map.remove(&token)?;
        (e.at.elapsed() < self.ttl).then_some(e.issued)
    }

    /// Tokens held now.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_leads_back_once_and_only_for_its_route() {
        let t = LeaseTokens::default();
        let issued = Issued { original: 7, child: 1 };
        let tok = t.insert("failover:a", issued);
        assert!(LeaseTokens::is_router_token(tok));
        assert!(LeaseTokens::conflicts(tok));
        assert_eq!(t.take("failover:b", tok), None);
        assert_eq!(t.take("failover:a", tok), Some(issued));
        assert_eq!(t.take("failover:a", tok), None);
        assert_eq!(t.take("failover:a", 7), None);
        assert!(t.is_empty());
    }

    #[test]
    fn server_tokens_that_clients_would_misread_conflict() {
        assert!(LeaseTokens::conflicts(0));
        assert!(LeaseTokens::conflicts(1)); // the hot-miss token
        assert!(!LeaseTokens::conflicts(2));
        assert!(!LeaseTokens::conflicts(u64::MAX));
    }

    #[test]
    fn old_tokens_are_not_honoured() {
        let t = LeaseTokens::new(Duration::ZERO);
        let tok = t.insert("r", Issued { original: 9, child: 0 });
        assert_eq!(t.take("r", tok), None);
    }
}
