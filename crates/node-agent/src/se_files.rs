//! Selenium Grid's file endpoints of a WebDriver session, served by the
//! agent (chromedriver never sees them), and the upload folder they share
//! with MCP's `browser_file_upload` ([`place_upload`]):
//! - remote upload, `POST /session/{id}/se/file` (or chromedriver's older
//!   `/file`, which WebdriverIO uses) with `{"file": base64 zip}`:
//!   the zip's one file is written to a new folder of the instance's uploads
//!   directory (the agent's, read-only to the browser and its chromedriver)
//!   and its path as the browser sees it is the answer, which the client then
//!   types into a file input;
//! - managed downloads (`se:downloadsEnabled`), over the instance's own
//!   downloads: `GET /session/{id}/se/files` lists the finished ones,
//!   `POST` with `{"name"}` answers one as a base64 zip, `DELETE` removes
//!   them all.
//!
//! Everything here reads hostile input: the body is bounded before it is
//! read, a zip must hold exactly one plain file whose inflated size is
//! bounded while it inflates, and a download is named, never a path.

use std::io::{Read, Write};
use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::browser::InstanceDirs;
use crate::sandbox::Isolation;
use crate::webdriver::WebDriverError;

/// File operations running at once on a node (each may hold a few copies of
/// a 64 MiB body, or a 64 MiB zip): the others wait their turn.
pub static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The largest upload request (base64 of the zip, in JSON).
pub const MAX_UPLOAD_BODY: usize = 64 << 20;
/// The largest file an upload may inflate to.
pub const MAX_UPLOAD_FILE: u64 = 256 << 20;
/// The largest download answered as a zip (in memory, base64); larger ones
/// are fetched from the downloads API.
pub const MAX_MANAGED_DOWNLOAD: u64 = 64 << 20;

fn invalid(message: impl Into<String>) -> WebDriverError {
    WebDriverError::new(400, "invalid argument", message)
}

fn failed(message: impl Into<String>) -> WebDriverError {
    WebDriverError::new(500, "unknown error", message)
}

/// A JSON body's string field `name`.
fn string_field(body: &[u8], name: &str) -> Result<String, WebDriverError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| invalid(format!("the body is not JSON: {e}")))?;
    value
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("the body must be {{\"{name}\": \"…\"}}")))
}

/// Whether `name` can be a file's name in a folder of ours: not empty,
/// `.` or `..`, no separator or control character, at most 255 bytes.
fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// `POST /session/{id}/se/file`: writes the uploaded zip's file into a new
/// folder of `dirs.uploads()` and answers its path as the browser sees it.
pub fn upload(
    dirs: &InstanceDirs,
    isolation: &Isolation,
    body: &[u8],
) -> Result<Value, WebDriverError> {
    let encoded = string_field(body, "file")?;
    // Python's Selenium wraps its base64 at 76 columns.
    let compact: Vec<u8> = encoded
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    let zipped = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| invalid(format!("file is not base64: {e}")))?;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zipped))
        .map_err(|e| invalid(format!("file is not a zip archive: {e}")))?;
    if archive.len() != 1 {
        return Err(invalid(format!(
            "the zip must hold exactly one file (it holds {} entries)",
            archive.len()
        )));
    }
    let mut entry = archive
        .by_index(0)
        .map_err(|e| invalid(format!("the zip's entry cannot be read: {e}")))?;
    let name = String::from_utf8(entry.name_raw().to_vec())
        .map_err(|_| invalid("the zipped file's name is not UTF-8"))?;
    if !entry.is_file() {
        return Err(invalid(format!(
            "the zip's entry {name:?} is not a plain file"
        )));
    }
    if entry.size() > MAX_UPLOAD_FILE {
        return Err(too_large_upload());
    }
    let seen = place_upload(dirs, isolation, &name, &mut entry)?;
    Ok(json!(seen.to_string_lossy()))
}

/// Writes the file `name` read from `content` (at most [`MAX_UPLOAD_FILE`]
/// bytes, whatever it claims) into a new folder of `dirs.uploads()`, hands
/// it to the browser, and answers its path as the browser sees it.
pub fn place_upload(
    dirs: &InstanceDirs,
    isolation: &Isolation,
    name: &str,
    content: &mut impl Read,
) -> Result<std::path::PathBuf, WebDriverError> {
    if !plain_file_name(name) {
        return Err(invalid(format!(
            "{name:?} is not a plain file name (no folders, '/', '..' or control characters)"
        )));
    }
    let folder_name = uuid::Uuid::new_v4().simple().to_string();
    let folder = dirs.uploads().join(&folder_name);
    std::fs::create_dir_all(dirs.uploads())
        .and_then(|()| std::fs::create_dir(&folder))
        .map_err(|e| failed(format!("cannot make the upload's folder: {e}")))?;
    let written = write_bounded(content, &folder.join(name));
    if let Err(error) = written {
        let _ = std::fs::remove_dir_all(&folder);
        return Err(error);
    }
    isolation
        .give_to_browser(&folder)
        .map_err(|e| failed(format!("cannot hand the upload to the browser: {e}")))?;
    Ok(isolation
        .browser_paths(dirs)
        .uploads
        .join(folder_name)
        .join(name))
}

fn too_large_upload() -> WebDriverError {
    invalid(format!(
        "the uploaded file inflates to more than {} MiB",
        MAX_UPLOAD_FILE >> 20
    ))
}

/// Inflates `entry` into a new file at `path`, refusing more than
/// [`MAX_UPLOAD_FILE`] bytes whatever the zip declared.
fn write_bounded(entry: &mut impl Read, path: &Path) -> Result<(), WebDriverError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| failed(format!("cannot write the upload: {e}")))?;
    let copied = std::io::copy(&mut entry.take(MAX_UPLOAD_FILE + 1), &mut file)
        .map_err(|e| invalid(format!("the zipped file cannot be inflated: {e}")))?;
    if copied > MAX_UPLOAD_FILE {
        return Err(too_large_upload());
    }
    file.flush()
        .map_err(|e| failed(format!("cannot write the upload: {e}")))
}

/// `GET /session/{id}/se/files`: the finished downloads' names.
pub fn list(dirs: &InstanceDirs) -> Result<Value, WebDriverError> {
    let names: Vec<String> = crate::downloads::list(&dirs.downloads())
        .map_err(|e| failed(format!("cannot list downloads: {e}")))?
        .into_iter()
        .filter(|d| d.state == flotilla_api_types::instances::DownloadState::Complete)
        .map(|d| d.name)
        .collect();
    Ok(json!({"names": names}))
}

/// `POST /session/{id}/se/files` with `{"name"}`: the download as a zip
/// holding it, base64 (`{"filename", "contents"}`).
pub fn download(dirs: &InstanceDirs, body: &[u8]) -> Result<Value, WebDriverError> {
    let name = string_field(body, "name")?;
    let name = crate::downloads::checked_name(&name).map_err(|e| invalid(e.to_string()))?;
    let (mut file, length) = crate::downloads::open(&dirs.downloads(), name).map_err(|_| {
        invalid(format!(
            "no download {name:?}: GET /session/{{id}}/se/files lists them"
        ))
    })?;
    if length > MAX_MANAGED_DOWNLOAD {
        return Err(invalid(format!(
            "{name:?} is larger than {} MiB: fetch it from GET /v2/instances/{{id}}/downloads/{{name}}",
            MAX_MANAGED_DOWNLOAD >> 20
        )));
    }
    let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(false);
    let zipping = (|| -> std::io::Result<Vec<u8>> {
        zipped.start_file(name, options)?;
        std::io::copy(&mut (&mut file).take(MAX_MANAGED_DOWNLOAD), &mut zipped)?;
        Ok(zipped.finish()?.into_inner())
    })();
    let bytes = zipping.map_err(|e| failed(format!("cannot zip {name:?}: {e}")))?;
    let contents = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(json!({"filename": name, "contents": contents}))
}

/// `DELETE /session/{id}/se/files`: removes every download.
pub fn delete_all(dirs: &InstanceDirs) -> Result<Value, WebDriverError> {
    let dir = dirs.downloads();
    let downloads =
        crate::downloads::list(&dir).map_err(|e| failed(format!("cannot list downloads: {e}")))?;
    for download in downloads {
        crate::downloads::remove(&dir, &download.name)
            .map_err(|e| failed(format!("cannot remove {:?}: {e}", download.name)))?;
    }
    Ok(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zip_of(entries: &[(&str, &[u8])]) -> String {
        let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (name, data) in entries {
            zipped
                .start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            zipped.write_all(data).unwrap();
        }
        base64::engine::general_purpose::STANDARD.encode(zipped.finish().unwrap().into_inner())
    }

    fn setup() -> (tempfile::TempDir, InstanceDirs, Isolation) {
        let temp = tempfile::tempdir().unwrap();
        let dirs = InstanceDirs::new(temp.path().join("i1"));
        dirs.create().unwrap();
        (temp, dirs, Isolation::none())
    }

    fn upload_of(
        dirs: &InstanceDirs,
        isolation: &Isolation,
        file: &str,
    ) -> Result<Value, WebDriverError> {
        upload(
            dirs,
            isolation,
            json!({"file": file}).to_string().as_bytes(),
        )
    }

    #[test]
    fn an_upload_lands_in_its_own_folder_and_answers_its_path() {
        let (_temp, dirs, isolation) = setup();
        // Wrapped at 76 columns, as Python's Selenium sends it.
        let encoded = zip_of(&[("notes.txt", b"hello")]);
        let wrapped: String = encoded
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\n", std::str::from_utf8(c).unwrap()))
            .collect();
        let path = upload_of(&dirs, &isolation, &wrapped).unwrap();
        let path = Path::new(path.as_str().unwrap());
        assert!(path.starts_with(dirs.uploads()), "{}", path.display());
        assert_eq!(std::fs::read(path).unwrap(), b"hello");
        let again = upload_of(&dirs, &isolation, &encoded).unwrap();
        assert_ne!(again.as_str().unwrap(), path.to_str().unwrap());
    }

    #[test]
    fn hostile_uploads_are_refused_and_leave_nothing() {
        let (_temp, dirs, isolation) = setup();
        let bomb = {
            let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            zipped.start_file("big.bin", options).unwrap();
            let zeros = vec![0u8; 1 << 20];
            for _ in 0..=(MAX_UPLOAD_FILE >> 20) {
                zipped.write_all(&zeros).unwrap();
            }
            base64::engine::general_purpose::STANDARD.encode(zipped.finish().unwrap().into_inner())
        };
        for (file, why) in [
            (zip_of(&[("../escape.txt", b"x")]), "not a plain file name"),
            (zip_of(&[("a/b.txt", b"x")]), "not a plain file name"),
            (zip_of(&[("..", b"x")]), "not a plain file name"),
            (
                zip_of(&[("a.txt", b"x"), ("b.txt", b"y")]),
                "exactly one file",
            ),
            (zip_of(&[]), "exactly one file"),
            ("not base64!".to_owned(), "not base64"),
            (
                base64::engine::general_purpose::STANDARD.encode(b"PK no zip"),
                "not a zip",
            ),
            (bomb, "inflates to more than"),
        ] {
            let error = upload_of(&dirs, &isolation, &file).unwrap_err();
            assert_eq!(error.code, "invalid argument");
            assert!(error.message.contains(why), "{why}: {}", error.message);
        }
        let error = upload(&dirs, &isolation, b"{\"file\": 3}").unwrap_err();
        assert!(error.message.contains("{\"file\""), "{}", error.message);
        assert_eq!(std::fs::read_dir(dirs.uploads()).unwrap().count(), 0);
        assert!(!dirs.root.join("escape.txt").exists());
    }

    #[test]
    fn managed_downloads_are_named_zipped_and_deleted() {
        let (_temp, dirs, _) = setup();
        std::fs::write(dirs.downloads().join("report.csv"), b"a,b\n1,2\n").unwrap();
        std::fs::write(dirs.downloads().join("half.bin.crdownload"), b"..").unwrap();
        assert_eq!(list(&dirs).unwrap(), json!({"names": ["report.csv"]}));
        let answer = download(&dirs, br#"{"name": "report.csv"}"#).unwrap();
        assert_eq!(answer["filename"], "report.csv");
        let zipped = base64::engine::general_purpose::STANDARD
            .decode(answer["contents"].as_str().unwrap())
            .unwrap();
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zipped)).unwrap();
        let mut text = String::new();
        archive
            .by_name("report.csv")
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "a,b\n1,2\n");
        for name in ["../../etc/passwd", "/etc/passwd", ".hidden", "missing.txt"] {
            let body = json!({"name": name}).to_string();
            let error = download(&dirs, body.as_bytes()).unwrap_err();
            assert_eq!(error.code, "invalid argument", "{name}");
        }
        delete_all(&dirs).unwrap();
        assert_eq!(list(&dirs).unwrap(), json!({"names": []}));
    }
}
