//! How a browser is confined: as its own user in a bubblewrap sandbox that
//! shows it only its instance's files ([`sandbox`]), in a network namespace
//! of its own ([`netns`]) whose only way out is the agent's egress proxy and
//! its policy ([`egress`]).

pub mod egress;
pub mod netns;
pub mod sandbox;
