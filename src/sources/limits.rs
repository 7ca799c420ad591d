//! What a network input lets in: an allowlist of sender networks (CIDR) and, for TCP, bounds
//! on connections, per-connection buffers and idle time. Refused datagrams and connections
//! never become frames: they are reported as [`super::Received::Refused`] with one of
//! [`REFUSED_REASONS`] and counted in `trigd_input_refused_total{source,reason}`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::frame::MAX_FRAME_LEN;

/// The sender is outside the input's allowlist.
pub const REFUSED_NOT_ALLOWED: &str = "not_allowed";
/// The TCP input already serves its most connections.
pub const REFUSED_TOO_MANY: &str = "too_many_connections";
/// A TCP connection sent nothing for `idle_timeout`.
pub const REFUSED_IDLE: &str = "idle";
/// A TCP connection stopped inside a frame for `stall_timeout`.
pub const REFUSED_STALLED: &str = "stalled";
/// Every reason an input refuses with (pre-resolved metric children).
pub const REFUSED_REASONS: [&str; 4] = [
    REFUSED_NOT_ALLOWED,
    REFUSED_TOO_MANY,
    REFUSED_IDLE,
    REFUSED_STALLED,
];

/// A network in CIDR notation: `10.0.0.0/8`, `192.168.1.7` (one host), `fd00::/8`.
/// IPv4 networks also match IPv4-mapped IPv6 senders (`::ffff:10.1.2.3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// A string that is not a CIDR network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {input:?}: {why}; expected ADDRESS/PREFIX such as 10.0.0.0/8, 127.0.0.1 or fd00::/8")]
pub struct ParseCidrError {
    pub input: String,
    pub why: String,
}

impl FromStr for Cidr {
    type Err = ParseCidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| ParseCidrError {
            input: s.to_string(),
            why: why.to_string(),
        };
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().map_err(|_| err("not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| err("prefix length out of range"))?,
        };
        let c = Cidr { addr, prefix };
        if c.network_bits(addr) != bits(addr) {
            return Err(err("host bits set beyond the prefix"));
        }
        Ok(c)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

impl Cidr {
    fn width(&self) -> u32 {
        if self.addr.is_ipv4() {
            32
        } else {
            128
        }
    }

    fn network_bits(&self, a: IpAddr) -> u128 {
        let width = self.width();
        let host = width - u32::from(self.prefix);
        if host == 128 {
            return 0;
        }
        (bits(a) >> host) << host
    }

    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (IpAddr::V6(_), IpAddr::V4(_)) => return false,
            _ => ip,
        };
        self.network_bits(ip) == bits(self.addr)
    }
}

/// Defaults of the TCP bounds.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What one network input admits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Sender networks let in; empty: every sender.
    pub allow: Vec<Cidr>,
    /// TCP: connections served at once.
    pub max_connections: usize,
    /// TCP: largest frame (and so receive buffer) per connection, bytes.
    pub max_frame_bytes: usize,
    /// TCP: a connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// TCP: a connection that stops inside a frame for this long is closed.
    pub stall_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            max_connections: super::MAX_TCP_CONNECTIONS,
            max_frame_bytes: MAX_FRAME_LEN,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

impl Limits {
    /// Whether a sender at `ip` may send to this input.
    #[inline]
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_and_nothing_else() {
        let n: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains(ip("10.1.0.0")) && n.contains(ip("10.1.255.255")));
        assert!(!n.contains(ip("10.2.0.0")) && !n.contains(ip("9.1.0.1")));
        assert!(n.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped IPv6");
        assert!(!n.contains(ip("::1")));
        let host: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(host.to_string(), "127.0.0.1/32");
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let any6: Cidr = "::/0".parse().unwrap();
        assert!(any6.contains(ip("2001:db8::1")));
    }

    #[test]
    fn bad_networks_are_refused_with_the_text() {
        for bad in [
            "10.0.0.1/8",
            "10.0.0.0/33",
            "fd00::/129",
            "host/8",
            "",
            "10.0.0.0/x",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err().to_string();
            assert!(e.contains("expected ADDRESS/PREFIX"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_empty_allowlist_lets_everyone_in() {
        let mut l = Limits::default();
        assert!(l.allows(ip("198.51.100.1")));
        l.allow = vec!["127.0.0.0/8".parse().unwrap()];
        assert!(l.allows(ip("127.0.0.5")) && !l.allows(ip("198.51.100.1")));
    }
}
