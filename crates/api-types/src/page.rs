//! Steps on an instance's page that the control plane's MCP server asks of
//! the instance's node (`POST /agent/v1/instances/{id}/page`), and their
//! answers. Elements are named by the references a snapshot gives
//! (`e<n>`, numbered by the node for the instance), stable for as long as
//! the element is in the document they were read from.

use serde::{Deserialize, Serialize};

/// One step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PageOp {
    Navigate {
        url: String,
    },
    Back,
    Snapshot,
    Click {
        element: String,
        #[serde(default)]
        double: bool,
    },
    Hover {
        element: String,
    },
    Drag {
        from: String,
        to: String,
    },
    Type {
        element: String,
        text: String,
        #[serde(default)]
        submit: bool,
    },
    PressKey {
        key: String,
    },
    SelectOption {
        element: String,
        values: Vec<String>,
    },
    WaitFor {
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        text_gone: Option<String>,
        #[serde(default)]
        time_ms: Option<u64>,
    },
    Evaluate {
        expression: String,
    },
    Screenshot,
    TabList,
    TabNew {
        #[serde(default)]
        url: Option<String>,
    },
    TabSelect {
        tab: String,
    },
    TabClose {
        tab: String,
    },
    ConsoleMessages,
    NetworkRequests,
    /// Sets a file input's files (`files` are written on the node first).
    FileUpload {
        element: String,
        files: Vec<UploadFile>,
    },
    /// The instance's downloads.
    Downloads,
}

/// A file from the agent's side for a file input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadFile {
    /// A plain file name (no folders).
    pub name: String,
    /// Its bytes, base64.
    pub content_base64: String,
}

/// A step on `tab` (the browser's first page when `None`), within
/// `timeout_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentPageRequest {
    #[serde(default)]
    pub tab: Option<String>,
    pub op: PageOp,
    pub timeout_ms: u64,
}

/// A tab of the browser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TabInfo {
    pub id: String,
    pub url: String,
    pub title: String,
}

/// What a step answers: text for the agent, an image for a screenshot, and
/// the tab the next step should use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PageAnswer {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png_base64: Option<String>,
    /// The tab that is current after the step.
    pub tab: String,
}
