//! Authorization, as pure functions: what a zone may touch (DESIGN.md section 3, issue 11).
//!
//! A zone may only read and write keys under its [`Scope`], `/kontinuum.sh/zones/<region>/
//! <zone>/` (the trailing slash keeps `eu/1a` out of `eu/1ab`). Every key, range end, Txn
//! compare and op (recursively, reads too) and every watch range must lie inside it; a range
//! that starts inside and ends outside is refused, never clipped. etcd's range conventions
//! are honoured: an empty `range_end` is the single key, `"\0"` is every key from `key` on
//! (which always leaves the prefix), anything else is the half-open `[key, range_end)`.
//!
//! Leases are authorized against their owner, recorded by the proxy in the store at
//! [`lease_owner_key`] (a key outside every zone's prefix, attached to the lease itself, so
//! it disappears with it): see [`owned_leases_txn`] for how a write that attaches leases is
//! made atomic with the ownership check.

use std::collections::BTreeSet;

use kontinuum_proto::etcd::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, compare, request_op,
};

/// Every zone's keys live under this prefix.
pub const ZONES_PREFIX: &str = "/kontinuum.sh/zones/";
/// The proxy's own records of which zone granted which lease: `<prefix><lease id>` → zone.
pub const LEASE_OWNERS_PREFIX: &str = "/kontinuum.sh/proxy/leases/";

/// Why a request was refused. The `Display` text is what the caller sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A key, or a range, lies (partly) outside the zone's prefix.
    #[error("key or range outside the zone's prefix")]
    OutsidePrefix,
    /// A watch range lies (partly) outside the zone's prefix.
    #[error("watch range outside the zone's prefix")]
    WatchOutsidePrefix,
    /// The lease was granted by someone else.
    #[error("lease not granted by this zone")]
    ForeignLease,
    /// Compaction is the hub's business.
    #[error("compaction is not allowed")]
    Compact,
}

impl Denied {
    /// Stable CamelCase, for the `reason` label of `authz_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::OutsidePrefix => "OutsidePrefix",
            Self::WatchOutsidePrefix => "WatchOutsidePrefix",
            Self::ForeignLease => "ForeignLease",
            Self::Compact => "Compact",
        }
    }
}

/// A label value that cannot make a prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("region and zone must be non-empty and free of '/'")]
pub struct InvalidScope;

/// The keys one zone may touch: `[prefix, end)` where `end` is the prefix with its last byte
/// (`/`) incremented, i.e. exactly the keys that start with the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    prefix: Vec<u8>,
    end: Vec<u8>,
}

impl Scope {
    /// The scope of zone `<region>-<zone>`. Neither part may be empty or hold `/` (which
    /// would let one zone's prefix nest inside another's).
    pub fn new(region: &str, zone: &str) -> Result<Self, InvalidScope> {
        let valid = |s: &str| !s.is_empty() && !s.contains('/');
        if !valid(region) || !valid(zone) {
            return Err(InvalidScope);
        }
        let prefix = format!("{ZONES_PREFIX}{region}/{zone}/").into_bytes();
        let mut end = prefix.clone();
        // The prefix ends in '/', so incrementing its last byte cannot overflow.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        Ok(Self { prefix, end })
    }

    /// `/kontinuum.sh/zones/<region>/<zone>/`.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Whether a single key is inside.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix)
    }

    /// Whether every key of the etcd range `(key, range_end)` is inside.
    pub fn contains_range(&self, key: &[u8], range_end: &[u8]) -> bool {
        if range_end.is_empty() {
            return self.contains_key(key);
        }
        if range_end == [0] {
            // "every key >= key": unbounded, so it always leaves the prefix.
            return false;
        }
        // key starts with the prefix and range_end <= end: every k with key <= k < range_end
        // then also starts with the prefix. (range_end <= key is an empty range: harmless.)
        self.contains_key(key) && range_end <= self.end.as_slice()
    }

    fn check(&self, key: &[u8], range_end: &[u8]) -> Result<(), Denied> {
        if self.contains_range(key, range_end) {
            Ok(())
        } else {
            Err(Denied::OutsidePrefix)
        }
    }
}

/// Authorizes a Range.
pub fn check_range(scope: &Scope, req: &RangeRequest) -> Result<(), Denied> {
    scope.check(&req.key, &req.range_end)
}

/// Authorizes a Put's key (its lease is checked against the store, see [`owned_leases_txn`]).
pub fn check_put(scope: &Scope, req: &PutRequest) -> Result<(), Denied> {
    scope.check(&req.key, &[])
}

/// Authorizes a DeleteRange.
pub fn check_delete(scope: &Scope, req: &DeleteRangeRequest) -> Result<(), Denied> {
    scope.check(&req.key, &req.range_end)
}

/// Authorizes one Txn compare (single key or, since etcd 3.3, a range).
pub fn check_compare(scope: &Scope, cmp: &Compare) -> Result<(), Denied> {
    scope.check(&cmp.key, &cmp.range_end)
}

/// Authorizes a Txn: every compare and every op of both branches, nested Txns included.
pub fn check_txn(scope: &Scope, txn: &TxnRequest) -> Result<(), Denied> {
    txn.compare
        .iter()
        .try_for_each(|c| check_compare(scope, c))?;
    txn.success
        .iter()
        .chain(&txn.failure)
        .try_for_each(|op| check_op(scope, op))
}

fn check_op(scope: &Scope, op: &RequestOp) -> Result<(), Denied> {
    match &op.request {
        Some(request_op::Request::RequestRange(r)) => check_range(scope, r),
        Some(request_op::Request::RequestPut(p)) => check_put(scope, p),
        Some(request_op::Request::RequestDeleteRange(d)) => check_delete(scope, d),
        Some(request_op::Request::RequestTxn(t)) => check_txn(scope, t),
        // An empty op touches nothing; etcd refuses it.
        None => Ok(()),
    }
}

/// Authorizes a watch's range.
pub fn check_watch(scope: &Scope, req: &WatchCreateRequest) -> Result<(), Denied> {
    scope
        .check(&req.key, &req.range_end)
        .map_err(|_| Denied::WatchOutsidePrefix)
}

/// The leases a Txn's puts attach (both branches, nested Txns included).
pub fn txn_leases(txn: &TxnRequest) -> BTreeSet<i64> {
    let mut out = BTreeSet::new();
    collect_leases(txn, &mut out);
    out
}

fn collect_leases(txn: &TxnRequest, out: &mut BTreeSet<i64>) {
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(request_op::Request::RequestPut(p)) if p.lease != 0 && !p.ignore_lease => {
                out.insert(p.lease);
            }
            Some(request_op::Request::RequestTxn(t)) => collect_leases(t, out),
            _ => {}
        }
    }
}

/// Where the proxy records the owner of lease `id`.
pub fn lease_owner_key(id: i64) -> Vec<u8> {
    format!("{LEASE_OWNERS_PREFIX}{id}").into_bytes()
}

/// The lease id of an owner record's key, if it is one.
pub fn lease_of_owner_key(key: &[u8]) -> Option<i64> {
    key.strip_prefix(LEASE_OWNERS_PREFIX.as_bytes())
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|rest| rest.parse().ok())
}

/// The compare "lease `id` was granted by `zone`".
pub fn owned_by(zone: &str, id: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal.into(),
        target: compare::CompareTarget::Value.into(),
        key: lease_owner_key(id),
        target_union: Some(compare::TargetUnion::Value(zone.as_bytes().to_vec())),
        range_end: Vec::new(),
    }
}

/// Wraps a write that attaches `leases` so the store checks ownership atomically with it:
/// `Txn { compare: [owner(l) == zone for l in leases], success: [op], failure: [] }`.
/// A zone's own Txn becomes a nested Txn, so its compares and branches keep their meaning;
/// `succeeded == false` on the outer Txn means a lease was not the zone's, and nothing ran.
pub fn owned_leases_txn(zone: &str, leases: &BTreeSet<i64>, op: RequestOp) -> TxnRequest {
    TxnRequest {
        compare: leases.iter().map(|&id| owned_by(zone, id)).collect(),
        success: vec![op],
        failure: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn scope() -> Scope {
        Scope::new("eu", "1a").unwrap()
    }

    const P: &[u8] = b"/kontinuum.sh/zones/eu/1a/";

    fn key(rest: &str) -> Vec<u8> {
        [P, rest.as_bytes()].concat()
    }

    fn put(k: &[u8], lease: i64) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: k.to_vec(),
                lease,
                ..Default::default()
            })),
        }
    }

    fn range(k: &[u8], end: &[u8]) -> RangeRequest {
        RangeRequest {
            key: k.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn ranges_follow_etcd_conventions() {
        let s = scope();
        let ok = |k: &[u8], e: &[u8]| check_range(&s, &range(k, e)).is_ok();
        // single keys
        assert!(ok(&key("a"), b""));
        assert!(ok(P, b""));
        assert!(!ok(b"/kontinuum.sh/zones/eu/1a", b""), "no trailing slash");
        assert!(!ok(b"/kontinuum.sh/zones/eu/1ab/x", b""), "sibling zone");
        assert!(!ok(b"/kontinuum.sh/zones/eu/1b/x", b""));
        assert!(!ok(b"", b""));
        // prefix ranges (clientv3 WithPrefix: end = prefix with last byte + 1)
        assert!(ok(P, b"/kontinuum.sh/zones/eu/1a0"));
        assert!(ok(&key("reg/"), &key("reg0")));
        assert!(!ok(
            b"/kontinuum.sh/zones/eu/1a",
            b"/kontinuum.sh/zones/eu/1b"
        ));
        // starts inside, ends outside: refused, not clipped
        assert!(!ok(&key("a"), b"/kontinuum.sh/zones/eu/1b"));
        assert!(!ok(&key("a"), b"\xff"));
        // "\0": every key >= key
        assert!(!ok(&key("a"), b"\0"));
        assert!(!ok(b"\0", b"\0"), "whole store");
        // empty range (end <= key): touches nothing
        assert!(ok(&key("b"), &key("a")));
    }

    #[test]
    fn txns_are_checked_everywhere_recursively() {
        let s = scope();
        let inside = key("x");
        let outside = b"/kontinuum.sh/zones/eu/1ab/x".to_vec();
        let cmp = |k: &[u8]| Compare {
            key: k.to_vec(),
            ..Default::default()
        };
        let good = TxnRequest {
            compare: vec![cmp(&inside)],
            success: vec![put(&inside, 0)],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestRange(range(&inside, b""))),
            }],
        };
        assert_eq!(check_txn(&s, &good), Ok(()));

        let mut bad_compare = good.clone();
        bad_compare.compare.push(cmp(&outside));
        let mut bad_range_compare = good.clone();
        bad_range_compare.compare.push(Compare {
            key: inside.clone(),
            range_end: b"\0".to_vec(),
            ..Default::default()
        });
        let mut bad_failure = good.clone();
        bad_failure.failure.push(RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: inside.clone(),
                    range_end: b"/kontinuum.sh/zones/eu/1b".to_vec(),
                    ..Default::default()
                },
            )),
        });
        let mut nested = good.clone();
        nested.success.push(RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest {
                success: vec![put(&outside, 0)],
                ..Default::default()
            })),
        });
        for (name, txn) in [
            ("compare", bad_compare),
            ("range compare", bad_range_compare),
            ("failure op", bad_failure),
            ("nested", nested),
        ] {
            assert_eq!(check_txn(&s, &txn), Err(Denied::OutsidePrefix), "{name}");
        }
    }

    #[test]
    fn watches_are_checked() {
        let s = scope();
        let w = |k: &[u8], e: &[u8]| WatchCreateRequest {
            key: k.to_vec(),
            range_end: e.to_vec(),
            ..Default::default()
        };
        assert_eq!(
            check_watch(&s, &w(P, b"/kontinuum.sh/zones/eu/1a0")),
            Ok(())
        );
        assert_eq!(
            check_watch(&s, &w(b"\0", b"\0")),
            Err(Denied::WatchOutsidePrefix)
        );
        assert_eq!(
            check_watch(
                &s,
                &w(b"/kontinuum.sh/zones/eu/1a", b"/kontinuum.sh/zones/eu/1b")
            ),
            Err(Denied::WatchOutsidePrefix)
        );
    }

    #[test]
    fn leases_attached_by_txns_are_found_recursively() {
        let inner = TxnRequest {
            failure: vec![put(&key("a"), 7)],
            ..Default::default()
        };
        let mut ignored = put(&key("c"), 9);
        if let Some(request_op::Request::RequestPut(p)) = &mut ignored.request {
            p.ignore_lease = true;
        }
        let txn = TxnRequest {
            success: vec![
                put(&key("b"), 5),
                put(&key("b"), 0),
                ignored,
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(inner)),
                },
            ],
            ..Default::default()
        };
        assert_eq!(txn_leases(&txn), BTreeSet::from([5, 7]));
        let wrapped = owned_leases_txn(
            "eu-1a",
            &BTreeSet::from([5, 7]),
            RequestOp {
                request: Some(request_op::Request::RequestTxn(txn)),
            },
        );
        assert_eq!(wrapped.compare.len(), 2);
        assert_eq!(wrapped.compare[0].key, b"/kontinuum.sh/proxy/leases/5");
        assert!(wrapped.failure.is_empty());
    }

    #[test]
    fn owner_keys_round_trip_and_lie_outside_every_zone() {
        assert_eq!(lease_of_owner_key(&lease_owner_key(42)), Some(42));
        assert_eq!(lease_of_owner_key(&lease_owner_key(-3)), Some(-3));
        assert_eq!(lease_of_owner_key(b"/kontinuum.sh/proxy/leases/x"), None);
        assert!(!scope().contains_key(&lease_owner_key(42)));
    }

    #[test]
    fn scopes_refuse_labels_that_nest() {
        assert!(Scope::new("eu", "1a/x").is_err());
        assert!(Scope::new("", "1a").is_err());
        assert!(Scope::new("eu", "").is_err());
        assert_eq!(
            Scope::new("eu-1", "a").unwrap().prefix(),
            b"/kontinuum.sh/zones/eu-1/a/"
        );
    }

    /// Bytes biased towards the interesting neighbourhood of the prefix.
    fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
        let near = prop_oneof![
            Just(b"/kontinuum.sh/zones/eu/1a/".to_vec()),
            Just(b"/kontinuum.sh/zones/eu/1a".to_vec()),
            Just(b"/kontinuum.sh/zones/eu/1ab/".to_vec()),
            Just(b"/kontinuum.sh/zones/eu/".to_vec()),
            Just(b"/kontinuum.sh/zones/eu/1a0".to_vec()),
            Just(b"/kontinuum.sh/zones/eu/1b".to_vec()),
            Just(Vec::new()),
            Just(vec![0]),
        ];
        (
            near,
            prop::collection::vec(any::<u8>(), 0..6),
            0usize..4,
            any::<bool>(),
        )
            .prop_map(|(base, tail, cut, truncate)| {
                let mut k = base;
                if truncate {
                    k.truncate(k.len().saturating_sub(cut));
                }
                k.extend(tail);
                k
            })
    }

    /// Every key a `(key, range_end)` pair can reach, sampled: the endpoints, their
    /// neighbours, and every key in between that `probe` names.
    fn range_admits(key: &[u8], end: &[u8], probe: &[u8]) -> bool {
        if end.is_empty() {
            return probe == key;
        }
        if end == [0] {
            return probe >= key;
        }
        probe >= key && probe < end
    }

    // Cases: proptest's default (256), or `PROPTEST_CASES` for a long run.
    proptest! {
        /// Whatever the range, if it is admitted then no key it covers is outside the prefix.
        #[test]
        fn admitted_ranges_never_reach_outside(
            key in key_bytes(),
            end in key_bytes(),
            probe in key_bytes(),
        ) {
            let s = scope();
            if s.contains_range(&key, &end) && range_admits(&key, &end, &probe) {
                prop_assert!(probe.starts_with(P), "{:?}..{:?} admits {:?}", key, end, probe);
            }
        }

        /// The same through a whole Txn: an admitted Txn names no key outside the prefix,
        /// and no range whose first key is outside.
        #[test]
        fn admitted_txns_touch_only_the_prefix(
            keys in prop::collection::vec((key_bytes(), key_bytes()), 1..6),
            shape in prop::collection::vec(0u8..5, 1..6),
        ) {
            let s = scope();
            let mut txn = TxnRequest::default();
            // (key, range end) of everything the Txn names; a put has no range end.
            let mut named: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for ((k, e), kind) in keys.iter().zip(shape.iter().cycle()) {
                let op = match kind {
                    0 => request_op::Request::RequestRange(range(k, e)),
                    1 => {
                        named.push((k.clone(), Vec::new()));
                        txn.success.push(put(k, 0));
                        continue;
                    }
                    2 => request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                        key: k.clone(), range_end: e.clone(), ..Default::default() }),
                    3 => request_op::Request::RequestTxn(TxnRequest {
                        failure: vec![RequestOp { request: Some(request_op::Request::RequestRange(range(k, e))) }],
                        ..Default::default() }),
                    _ => {
                        txn.compare.push(Compare { key: k.clone(), range_end: e.clone(), ..Default::default() });
                        named.push((k.clone(), e.clone()));
                        continue;
                    }
                };
                named.push((k.clone(), e.clone()));
                txn.success.push(RequestOp { request: Some(op) });
            }
            if check_txn(&s, &txn).is_ok() {
                for (k, e) in &named {
                    prop_assert!(k.starts_with(P), "admitted {:?}..{:?}", k, e);
                    prop_assert!(e.is_empty()
                        || (e.as_slice() != [0] && e.as_slice() <= b"/kontinuum.sh/zones/eu/1a0".as_slice()),
                        "admitted {:?}..{:?}", k, e);
                }
            }
        }
    }
}
