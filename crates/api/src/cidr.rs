//! IPv4 networks in CIDR notation, shared by the service proxy, the node agent's pod network and
//! the node IPAM controller.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use anyhow::Context;

/// An IPv4 network in CIDR notation, such as `10.96.0.0/12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Cidr {
    /// The network of `addr` with a prefix of `prefix` bits (host bits cleared); `None` when
    /// `prefix` is over 32.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        if prefix > 32 {
            return None;
        }
        Some(Self {
            network: Ipv4Addr::from(u32::from(addr) & Self::mask(prefix)),
            prefix,
        })
    }

    fn mask(prefix: u8) -> u32 {
        if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        }
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside the network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.prefix) == u32::from(self.network)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = anyhow::Error;

    /// `A.B.C.D/N`, or a bare address (a /32).
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((addr, prefix)) => (
                addr,
                prefix
                    .parse::<u8>()
                    .with_context(|| format!("parsing the prefix length of {s:?}"))?,
            ),
            None => (s.trim(), 32),
        };
        let addr: Ipv4Addr = addr.parse().with_context(|| format!("parsing the address of {s:?}"))?;
        Self::new(addr, prefix).with_context(|| format!("the prefix length of {s:?} is over 32"))
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Ipv4Cidr {
    /// A network from its network address (host bits clear) and prefix length (at most 32),
    /// for constants.
    pub const fn from_network(network: Ipv4Addr, prefix: u8) -> Self {
        Self { network, prefix }
    }

    /// How many addresses the network holds (2^32 for /0, hence u64).
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.prefix))
    }

    /// The `n`th address of the network (0 is the network address), wrapping inside it.
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        let host = if self.prefix == 0 {
            n
        } else {
            n & !Self::mask(self.prefix)
        };
        Ipv4Addr::from(u32::from(self.network) | host)
    }

    /// Whether the two networks share an address (one then contains the other).
    pub fn overlaps(&self, other: &Ipv4Cidr) -> bool {
        self.contains(other.network) || other.contains(self.network)
    }

    /// Whether `other` lies wholly inside this network.
    pub fn covers(&self, other: &Ipv4Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_contain() {
        let cidr: Ipv4Cidr = "10.96.1.2/12".parse().expect("cidr");
        assert_eq!(cidr.to_string(), "10.96.0.0/12");
        assert!(cidr.contains(Ipv4Addr::new(10, 111, 255, 255)));
        assert!(!cidr.contains(Ipv4Addr::new(10, 112, 0, 0)));
        assert_eq!("10.0.0.1".parse::<Ipv4Cidr>().expect("bare").to_string(), "10.0.0.1/32");
        assert!("10.0.0.0/33".parse::<Ipv4Cidr>().is_err());
        assert!("nonsense/8".parse::<Ipv4Cidr>().is_err());
        assert!(
            "0.0.0.0/0"
                .parse::<Ipv4Cidr>()
                .expect("all")
                .contains(Ipv4Addr::BROADCAST)
        );
    }

    #[test]
    fn sizes_addresses_and_overlaps() {
        let cidr: Ipv4Cidr = "10.244.0.0/16".parse().expect("cidr");
        assert_eq!(cidr.size(), 65_536);
        assert_eq!(cidr.nth(1), Ipv4Addr::new(10, 244, 0, 1));
        assert_eq!(cidr.nth(256), Ipv4Addr::new(10, 244, 1, 0));
        let node: Ipv4Cidr = "10.244.3.0/24".parse().expect("cidr");
        assert!(cidr.covers(&node) && !node.covers(&cidr));
        assert!(cidr.overlaps(&node) && node.overlaps(&cidr));
        assert!(!node.overlaps(&"10.244.4.0/24".parse().expect("cidr")));
        assert_eq!("0.0.0.0/0".parse::<Ipv4Cidr>().expect("all").size(), 1 << 32);
    }
}
