//! (placeholder, replaced by the recording module)
#[derive(Debug, Clone, Copy)]
pub enum FsyncPolicy {
    Never,
}
impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "never" {
            Ok(Self::Never)
        } else {
            Err(s.into())
        }
    }
}
