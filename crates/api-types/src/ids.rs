//! Typed identifiers. They are strings on the wire; the types keep an instance id
//! from being passed where a node id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;
use utoipa::ToSchema;

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
        #[serde(transparent)]
        #[schema(value_type = String)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_owned())
            }
        }
    };
}

string_id!(
    /// Identifier of a browser instance: a UUIDv7 in its hyphenated form, so that
    /// ids sort by creation time.
    InstanceId
);
string_id!(
    /// Identifier of a node (a machine running a node agent), chosen by the agent.
    NodeId
);
string_id!(
    /// Identifier of a dormant instance's snapshot in the snapshot store.
    SnapshotId
);
string_id!(
    /// Identifier of one operation the control plane asked a node to carry
    /// out on an instance (a create or a revive): the node reports the
    /// operation's outcome with it, so that a late answer can be told from
    /// the answer to the operation in progress.
    OperationId
);

impl InstanceId {
    /// A fresh, time-ordered instance id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }

    /// The DNS label this instance is reachable under: the id without dashes
    /// (32 lowercase hex characters, a valid label).
    pub fn subdomain(&self) -> String {
        self.0.replace('-', "")
    }
}

impl SnapshotId {
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }
}

impl OperationId {
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }
}
