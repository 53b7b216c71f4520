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
//! Everything here reads hostile input: an upload's body is decoded as it
//! arrives ([`UploadReceiver`]: its JSON read by a scanner that keeps no
//! tree, its base64 decoded into an unnamed temporary file), so the agent
//! holds a few kilobytes of it at a time whatever its size; the body is
//! bounded ([`MAX_UPLOAD_BODY`]); the zip's entries are counted from its
//! end record before the zip is read (exactly one), and its one plain
//! file's inflated size is bounded while it inflates. A download is named,
//! never a path.

use std::io::{Read, Write};
use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::confine::sandbox::Isolation;
use crate::engine::driver::WebDriverError;
use crate::system::dirs::InstanceDirs;

/// File operations running at once on a node (a managed download holds its
/// zip in memory): the others wait their turn.
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

/// `POST /session/{id}/se/file`'s body (`{"file": base64 zip}`), read as
/// it arrives: the zip is decoded into an unnamed temporary file beside the
/// instance's folders (the browser never sees it), never held in memory.
pub struct UploadReceiver {
    scanner: crate::protocols::client_frames::Scanner,
    /// Base64 characters not decoded yet (fewer than a group of four once
    /// a piece has been read), and whether the padded end was decoded.
    base64: Vec<u8>,
    ended: bool,
    zip: std::fs::File,
    body_bytes: usize,
}

impl UploadReceiver {
    pub fn new(dirs: &InstanceDirs) -> Result<Self, WebDriverError> {
        let zip = tempfile::tempfile_in(&dirs.root)
            .map_err(|e| failed(format!("cannot make room for the upload: {e}")))?;
        Ok(Self {
            scanner: crate::protocols::client_frames::Scanner::streaming_member("file"),
            base64: Vec::new(),
            ended: false,
            zip,
            body_bytes: 0,
        })
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, piece: &[u8]) -> Result<(), WebDriverError> {
        self.body_bytes += piece.len();
        if self.body_bytes > MAX_UPLOAD_BODY {
            return Err(invalid(format!(
                "the upload's body is over {} MiB",
                MAX_UPLOAD_BODY >> 20
            )));
        }
        self.scanner
            .feed(piece)
            .map_err(|e| invalid(format!("the body is not JSON: {e}")))?;
        let text = self.scanner.take_streamed();
        // Python's Selenium wraps its base64 at 76 columns.
        self.base64
            .extend(text.into_iter().filter(|b| !b.is_ascii_whitespace()));
        let whole = self.base64.len() / 4 * 4;
        self.decode(whole)
    }

    /// Decodes the first `count` base64 characters held into the zip.
    fn decode(&mut self, count: usize) -> Result<(), WebDriverError> {
        if count == 0 {
            return Ok(());
        }
        if self.ended {
            return Err(invalid("file is not base64: it goes on after its padding"));
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&self.base64[..count])
            .map_err(|e| invalid(format!("file is not base64: {e}")))?;
        self.ended = self.base64[count - 1] == b'=';
        self.base64.drain(..count);
        self.zip
            .write_all(&decoded)
            .map_err(|e| failed(format!("cannot keep the upload: {e}")))
    }

    /// The body has all arrived: the zip, read from its start.
    pub fn finish(mut self) -> Result<std::fs::File, WebDriverError> {
        let shape = || invalid("the body must be {\"file\": \"…\"} (a base64 zip)");
        self.scanner.finish().map_err(|_| shape())?;
        if !self.scanner.streamed_member_seen() || !self.scanner.streamed_member_was_string() {
            return Err(shape());
        }
        let rest = self.base64.len();
        self.decode(rest)?;
        use std::io::Seek as _;
        self.zip
            .rewind()
            .map_err(|e| failed(format!("cannot read the upload back: {e}")))?;
        Ok(self.zip)
    }
}

/// `POST /session/{id}/se/file`, once its body is in ([`UploadReceiver`]):
/// writes the zip's one file into a new folder of `dirs.uploads()` and
/// answers its path as the browser sees it.
pub fn upload(
    dirs: &InstanceDirs,
    isolation: &Isolation,
    mut zipped: std::fs::File,
) -> Result<Value, WebDriverError> {
    let entries = zip_entries(&mut zipped)?;
    if entries != 1 {
        return Err(invalid(format!(
            "the zip must hold exactly one file (it holds {entries} entries)"
        )));
    }
    let mut archive = zip::ZipArchive::new(zipped)
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

/// The number of entries a zip's end record declares, read from its last
/// bytes before anything else of it is (a zip that declares 200,000 would
/// have them all indexed in memory). Every end record signature in reach
/// must agree, and zip64 records (never needed by one small file) are
/// refused, so no reader can find a larger count elsewhere.
fn zip_entries(zipped: &mut std::fs::File) -> Result<u64, WebDriverError> {
    use std::io::{Seek, SeekFrom};
    const END: &[u8] = b"PK\x05\x06";
    const END_LEN: usize = 22;
    let length = zipped
        .seek(SeekFrom::End(0))
        .map_err(|e| failed(format!("cannot read the upload back: {e}")))?;
    let tail_len = length.min((END_LEN + u16::MAX as usize) as u64);
    let mut tail = vec![0u8; tail_len as usize];
    zipped
        .seek(SeekFrom::Start(length - tail_len))
        .and_then(|_| zipped.read_exact(&mut tail))
        .and_then(|()| zipped.rewind())
        .map_err(|e| failed(format!("cannot read the upload back: {e}")))?;
    let not_zip = || invalid("file is not a zip archive: no end record");
    if memchr::memmem::find(&tail, b"PK\x06\x06").is_some()
        || memchr::memmem::find(&tail, b"PK\x06\x07").is_some()
    {
        return Err(invalid("file is a zip64 archive: send one plain zip"));
    }
    let mut counts = memchr::memmem::rfind_iter(&tail, END)
        .filter(|at| at + END_LEN <= tail.len())
        .map(|at| {
            let field =
                |offset: usize| u16::from_le_bytes([tail[at + offset], tail[at + offset + 1]]);
            (field(8), field(10))
        });
    let (on_disk, total) = counts.next().ok_or_else(not_zip)?;
    if on_disk != total || counts.any(|other| other != (on_disk, total)) {
        return Err(invalid(
            "file is not a zip archive: its end records disagree",
        ));
    }
    Ok(u64::from(total))
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
    let names: Vec<String> = crate::system::downloads::list(&dirs.downloads())
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
    let name = crate::system::downloads::checked_name(&name).map_err(|e| invalid(e.to_string()))?;
    let (mut file, length) =
        crate::system::downloads::open(&dirs.downloads(), name).map_err(|_| {
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
    let downloads = crate::system::downloads::list(&dir)
        .map_err(|e| failed(format!("cannot list downloads: {e}")))?;
    for download in downloads {
        crate::system::downloads::remove(&dir, &download.name)
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

    /// An upload of `body`, read in pieces of 1,000 bytes.
    fn upload_body(
        dirs: &InstanceDirs,
        isolation: &Isolation,
        body: &[u8],
    ) -> Result<Value, WebDriverError> {
        let mut receiver = UploadReceiver::new(dirs)?;
        for piece in body.chunks(1000) {
            receiver.feed(piece)?;
        }
        upload(dirs, isolation, receiver.finish()?)
    }

    fn upload_of(
        dirs: &InstanceDirs,
        isolation: &Isolation,
        file: &str,
    ) -> Result<Value, WebDriverError> {
        upload_body(
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
        for body in [
            &b"{\"file\": 3}"[..],
            b"{\"files\": \"UEs=\"}",
            b"[\"file\"]",
        ] {
            let error = upload_body(&dirs, &isolation, body).unwrap_err();
            assert!(error.message.contains("{\"file\""), "{}", error.message);
        }
        let twice = format!(r#"{{"file":"{}","file":"x"}}"#, zip_of(&[("a.txt", b"x")]));
        let error = upload_body(&dirs, &isolation, twice.as_bytes()).unwrap_err();
        assert!(error.message.contains("file twice"), "{}", error.message);
        let padded_twice = format!("eA=={}", zip_of(&[("b.txt", b"y")]));
        let error = upload_of(&dirs, &isolation, &padded_twice).unwrap_err();
        assert!(error.message.contains("base64"), "{}", error.message);
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

    #[test]
    fn a_zip_of_many_entries_is_refused_from_its_end_record() {
        let (_temp, dirs, isolation) = setup();
        let names: Vec<String> = (0..5_000).map(|i| format!("f{i}")).collect();
        let entries: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b""[..])).collect();
        let error = upload_of(&dirs, &isolation, &zip_of(&entries)).unwrap_err();
        assert!(
            error.message.contains("holds 5000 entries"),
            "{}",
            error.message
        );
        // An end record hidden in the comment that disagrees with the real one.
        let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zipped
            .start_file("a.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        zipped.write_all(b"x").unwrap();
        let mut fake = b"PK\x05\x06".to_vec();
        fake.extend_from_slice(&[0, 0, 0, 0, 0x40, 0x0d, 0x40, 0x0d]);
        fake.extend_from_slice(&[0; 10]);
        zipped.set_raw_comment(fake.into());
        let bytes = zipped.finish().unwrap().into_inner();
        let error = upload_of(
            &dirs,
            &isolation,
            &base64::engine::general_purpose::STANDARD.encode(bytes),
        )
        .unwrap_err();
        assert!(error.message.contains("disagree"), "{}", error.message);
        assert_eq!(std::fs::read_dir(dirs.uploads()).unwrap().count(), 0);
    }

    #[test]
    fn an_upload_body_over_the_limit_is_refused_as_it_arrives() {
        let (_temp, dirs, _) = setup();
        let mut receiver = UploadReceiver::new(&dirs).unwrap();
        receiver.feed(br#"{"file":""#).unwrap();
        let piece = vec![b'A'; 1 << 20];
        let mut refused = None;
        for _ in 0..=(MAX_UPLOAD_BODY >> 20) {
            if let Err(error) = receiver.feed(&piece) {
                refused = Some(error);
                break;
            }
        }
        let error = refused.expect("refused");
        assert!(
            error.message.contains("is over 64 MiB"),
            "{}",
            error.message
        );
    }
}
