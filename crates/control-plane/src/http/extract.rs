//! Request extractors that turn every malformed body or query into a 400
//! `{detail, code: "invalid_request"}` naming the offending field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use flotilla_api_types::extensions::MAX_ZIP_BYTES;

use crate::error::Error;

/// A JSON body; unknown fields, wrong types and trailing garbage are rejected.
pub struct ApiJson<T>(pub T);

/// A JSON body that may be absent (an empty body or `null` means `T::default()`).
pub struct OptionalApiJson<T>(pub T);

/// An empty body, for operations that take none.
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self, Error> {
        let bytes = body_bytes(request, state).await?;
        let blank = bytes.iter().all(u8::is_ascii_whitespace) || bytes.as_ref() == b"{}";
        if blank {
            Ok(NoBody)
        } else {
            Err(Error::InvalidRequest(
                "this operation takes no request body".into(),
            ))
        }
    }
}

/// A zip body (`Content-Type: application/zip`) of at most
/// [`MAX_ZIP_BYTES`]; larger is a 413.
pub struct ZipBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ZipBody {
    type Rejection = Error;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Error> {
        let content_type = request
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .map(|value| value.trim().to_ascii_lowercase());
        if !matches!(
            content_type.as_deref(),
            Some("application/zip" | "application/x-zip-compressed")
        ) {
            return Err(Error::InvalidRequest(
                "the body must be a zip file sent with Content-Type: application/zip".into(),
            ));
        }
        let limit = MAX_ZIP_BYTES;
        axum::body::to_bytes(request.into_body(), limit)
            .await
            .map(ZipBody)
            .map_err(|e| {
                if std::error::Error::source(&e)
                    .is_some_and(|source| source.is::<http_body_util::LengthLimitError>())
                {
                    Error::PayloadTooLarge(format!(
                        "the zip is larger than {} MiB",
                        limit / (1024 * 1024)
                    ))
                } else {
                    Error::InvalidRequest(format!("cannot read the request body: {e}"))
                }
            })
    }
}

/// The query string; unknown parameters and bad values are rejected.
pub struct ApiQuery<T>(pub T);

fn describe<E: std::fmt::Display>(error: serde_path_to_error::Error<E>, what: &str) -> String {
    let path = error.path().to_string();
    let inner = error.inner().to_string();
    if path == "." || path.is_empty() {
        format!("invalid {what}: {inner}")
    } else if inner.starts_with("unknown field") {
        // The path ends with the unknown key itself; name where it was found.
        match path.rsplit_once('.') {
            Some((parent, _)) => format!("invalid {what}: {inner} (in {parent})"),
            None => format!("invalid {what}: {inner}"),
        }
    } else {
        format!("invalid {what}: {path}: {inner}")
    }
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    // serde would also accept a struct written as a JSON array; bodies are objects.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Error::InvalidRequest(
            "invalid request body: expected a JSON object".into(),
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|e| Error::InvalidRequest(describe(e, "request body")))?;
    deserializer
        .end()
        .map_err(|e| Error::InvalidRequest(format!("invalid request body: {e}")))?;
    Ok(value)
}

async fn body_bytes<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, Error> {
    Bytes::from_request(request, state).await.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            Error::PayloadTooLarge(format!("the request body is too large: {e}"))
        } else {
            Error::InvalidRequest(format!("cannot read the request body: {e}"))
        }
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self, Error> {
        let bytes = body_bytes(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::InvalidRequest(
                "a JSON request body is required (send {} to take every default)".into(),
            ));
        }
        parse_json(&bytes).map(ApiJson)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalApiJson<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self, Error> {
        let bytes = body_bytes(request, state).await?;
        // An optional body may be absent, or JSON `null` (what an OpenAPI
        // client sends for a nullable body it leaves out).
        if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
            return Ok(OptionalApiJson(T::default()));
        }
        parse_json(&bytes).map(OptionalApiJson)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|e| Error::InvalidRequest(describe(e, "query parameter")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_types::instances::{CreateInstanceRequest, ListInstancesQuery};

    #[test]
    fn body_errors_name_the_field() {
        let error = parse_json::<CreateInstanceRequest>(br#"{"config": {"memory_gb": "two"}}"#)
            .unwrap_err();
        assert!(error.to_string().contains("config.memory_gb"), "{error}");
        let error = parse_json::<CreateInstanceRequest>(br#"{"imag": "x"}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `imag`"),
            "{error}"
        );
        let error = parse_json::<CreateInstanceRequest>(br#"{"config": {"cpu": 1}}"#).unwrap_err();
        assert!(error.to_string().contains("(in config)"), "{error}");
        let error = parse_json::<CreateInstanceRequest>(br#"{} trailing"#).unwrap_err();
        assert!(error.to_string().contains("trailing"), "{error}");
        let error =
            parse_json::<CreateInstanceRequest>(br#"{"config": {"cpu_cores": 1.5}}"#).unwrap_err();
        assert!(error.to_string().contains("config.cpu_cores"), "{error}");
    }

    #[test]
    fn query_errors_name_the_parameter() {
        let parse = |q: &str| {
            let deserializer =
                serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
            serde_path_to_error::deserialize::<_, ListInstancesQuery>(deserializer)
                .map_err(|e| describe(e, "query parameter"))
        };
        assert!(parse("limit=abc").unwrap_err().contains("limit"));
        assert!(parse("status=sleeping").unwrap_err().contains("status"));
        assert!(parse("sort=name").unwrap_err().contains("sort"));
        assert!(
            parse("colour=red")
                .unwrap_err()
                .contains("unknown field `colour`")
        );
        let ok = parse("status=running&limit=5&offset=10&sort=memory_desc").unwrap();
        assert_eq!(ok.limit, Some(5));
    }
}
