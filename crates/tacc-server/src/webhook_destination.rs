//! Where webhook notifications may be sent. A task's owner chooses the URL, and the
//! server posts to it from inside the cluster's network: without a rule, a user could make
//! the server reach its own API on loopback (`/v1/admin/gc`), a cloud metadata service
//! (169.254.169.254) or any internal host. So, unless the operator allows them
//! (`taccd server --webhook-allow-private`, or `--webhook-allow CIDR` for some ranges),
//! destinations in loopback, link-local, private (RFC 1918, ULA), shared (CGNAT),
//! unspecified, multicast, broadcast or reserved ranges — and IPv6 forms that embed such an
//! IPv4 address — are refused:
//!
//! - at submit, when the URL's host is a literal address ([`WebhookPolicy::check_url`]);
//! - at send time, after DNS resolution: [`CheckedResolver`] is the delivery client's
//!   resolver and hands it only addresses that pass, so the connection goes to the very
//!   address that was checked (a name that resolves to loopback, or re-resolves to it
//!   later — DNS rebinding — is never connected to).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// The operator's rule for webhook destinations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookPolicy {
    /// Every destination is allowed, internal ones included (`--webhook-allow-private`).
    pub allow_private: bool,
    /// Internal ranges allowed all the same (`--webhook-allow CIDR`, repeatable).
    pub allowed: Vec<IpNet>,
}

/// Why a destination is refused: a message that says which address, why, and how an
/// operator would allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} is {kind} address; webhooks to internal addresses are refused unless the \
     operator allows them (taccd server --webhook-allow {range} or --webhook-allow-private)"
)]
pub struct DestinationRefused {
    what: String,
    kind: &'static str,
    range: String,
}

impl WebhookPolicy {
    /// Whether the server may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> Result<(), DestinationRefused> {
        let plain = unmapped(ip);
        if self.allow_private
            || self
                .allowed
                .iter()
                .any(|net| net.contains(&ip) || net.contains(&plain))
        {
            return Ok(());
        }
        match internal_kind(ip) {
            None => Ok(()),
            Some(kind) => Err(DestinationRefused {
                what: ip.to_string(),
                kind,
                range: IpNet::from(plain).to_string(),
            }),
        }
    }

    /// The submit-time check of a webhook URL: a literal address host must be permitted.
    /// (A host name is checked when it is resolved, at send time.)
    pub fn check_url(&self, url: &str) -> Result<(), DestinationRefused> {
        match literal_host(url) {
            Some(ip) => self.permits(ip).map_err(|mut refused| {
                refused.what = format!("the webhook's host {ip}");
                refused
            }),
            None => Ok(()),
        }
    }
}

/// The address a URL names as its host, when it names one literally (`127.1`, `[::1]`
/// and `0x7f.1` included: the URL parser normalises them as a client would).
pub fn literal_host(url: &str) -> Option<IpAddr> {
    match url::Url::parse(url).ok()?.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// The IPv4 address an IPv6 one stands for (mapped `::ffff:a.b.c.d`), else `ip` itself.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// `Some("a loopback")` etc. when `ip` is not a public unicast address.
fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "an unspecified (\"this network\")",
        _ if ip.is_loopback() => "a loopback",
        _ if ip.is_private() => "a private (RFC 1918)",
        _ if ip.is_link_local() => "a link-local",
        (100, 64..=127, _) => "a shared (carrier-grade NAT)",
        _ if ip.is_broadcast() => "a broadcast",
        _ if ip.is_multicast() => "a multicast",
        (240..=255, _, _) => "a reserved",
        (192, 0, 0) => "an IETF protocol",
        (198, 18..=19, _) => "a benchmarking",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation",
        _ => return None,
    })
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // IPv6 forms that carry an IPv4 address: the IPv4 rule decides.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return internal_v4(v4);
    }
    let embedded = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    // IPv4-compatible (::a.b.c.d, deprecated) and NAT64 (64:ff9b::/96).
    if segments[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback()
        || segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
    {
        return internal_v4(embedded(segments[6], segments[7]));
    }
    // 6to4 (2002:a.b.c.d::/48).
    if segments[0] == 0x2002 {
        return internal_v4(embedded(segments[1], segments[2]));
    }
    Some(match segments[0] {
        _ if ip.is_unspecified() => "an unspecified",
        _ if ip.is_loopback() => "a loopback",
        s if s & 0xffc0 == 0xfe80 => "a link-local",
        s if s & 0xffc0 == 0xfec0 => "a site-local",
        s if s & 0xfe00 == 0xfc00 => "a unique local (ULA)",
        s if s & 0xff00 == 0xff00 => "a multicast",
        0x2001 if segments[1] == 0x0db8 => "a documentation",
        _ => return None,
    })
}

/// The delivery client's DNS resolver: the system's answer, less every address the
/// policy refuses; a name left with none fails with why (a [`DestinationRefused`]).
#[derive(Debug, Clone)]
pub(crate) struct CheckedResolver {
    pub(crate) policy: Arc<WebhookPolicy>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let kept: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| match policy.permits(addr.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused.get_or_insert(why);
                        false
                    }
                })
                .collect();
            if kept.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> = match refused {
                    Some(mut why) => {
                        why.what = format!("{host} resolves to {}, which", why.what);
                        Box::new(why)
                    }
                    None => format!("{host} resolves to no address").into(),
                };
                return Err(error);
            }
            let addrs: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

/// The [`DestinationRefused`] somewhere in `error`'s chain of causes, if any.
pub(crate) fn refusal_in<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a DestinationRefused> {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(refused) = current.downcast_ref::<DestinationRefused>() {
            return Some(refused);
        }
        cause = current.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> bool {
        WebhookPolicy::default()
            .permits(text.parse().unwrap())
            .is_err()
    }

    #[test]
    fn internal_addresses_are_refused_in_every_form() {
        for internal in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
        ] {
            assert!(refused(internal), "{internal} must be refused");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!refused(public), "{public} must be allowed");
        }
    }

    #[test]
    fn the_operator_may_allow_all_or_some_ranges() {
        let all = WebhookPolicy {
            allow_private: true,
            allowed: vec![],
        };
        assert!(all.permits("127.0.0.1".parse().unwrap()).is_ok());
        let some = WebhookPolicy {
            allow_private: false,
            allowed: vec!["10.0.0.0/8".parse().unwrap()],
        };
        assert!(some.permits("10.2.3.4".parse().unwrap()).is_ok());
        assert!(some.permits("::ffff:10.2.3.4".parse().unwrap()).is_ok());
        assert!(some.permits("192.168.0.1".parse().unwrap()).is_err());
    }

    #[test]
    fn literal_hosts_are_checked_at_submit_and_names_are_left_to_resolution() {
        let policy = WebhookPolicy::default();
        for url in [
            "http://127.0.0.1:8383/v1/admin/gc",
            "http://127.1/x",
            "http://0x7f000001/x",
            "http://[::1]:80/x",
            "https://[::ffff:7f00:1]/x",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let error = policy.check_url(url).unwrap_err().to_string();
            assert!(error.contains("--webhook-allow"), "{url}: {error}");
        }
        assert!(policy.check_url("https://hooks.example.com/x").is_ok());
        assert!(policy.check_url("http://localhost:9/x").is_ok());
        let error = policy.check_url("http://127.0.0.1:1/").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the webhook's host 127.0.0.1 is a loopback address; webhooks to internal \
             addresses are refused unless the operator allows them (taccd server \
             --webhook-allow 127.0.0.1/32 or --webhook-allow-private)"
        );
    }
}
