//! (placeholder, replaced by the sources module)
#[derive(Debug, Clone)]
pub enum Endpoint {
    Udp(std::net::SocketAddr),
    Tcp(std::net::SocketAddr),
}
impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(a) = s.strip_prefix("udp://") {
            return a.parse().map(Endpoint::Udp).map_err(|e| format!("{e}"));
        }
        if let Some(a) = s.strip_prefix("tcp://") {
            return a.parse().map(Endpoint::Tcp).map_err(|e| format!("{e}"));
        }
        Err(format!("{s:?} is not udp://HOST:PORT or tcp://HOST:PORT"))
    }
}
