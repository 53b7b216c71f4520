//! Browser extensions as zip files: what an upload must be to load
//! ([`inspect`], run by the control plane before it keeps one) and unpacking
//! one into an instance's directory ([`unpack`], run by the agent before each
//! launch of a browser that loads it).
//!
//! A zip is hostile input: entry names are checked one by one (no absolute
//! paths, `..`, backslashes, control characters or duplicates), links and
//! encrypted entries are refused, the number of entries is capped before the
//! central directory is read (each entry costs memory to list), and the
//! bytes they unpack to are capped, counted as they are decompressed, not as
//! the zip declares them: [`inspect`] decompresses every entry (which also
//! checks each CRC), so a zip that lies is refused at upload.

use std::collections::HashSet;
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;
use zip::ZipArchive;

pub use flotilla_api_types::extensions::MAX_ZIP_BYTES;
/// Most entries in one zip.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes one zip may unpack to (zip bombs stop here).
pub const MAX_UNPACKED_BYTES: u64 = 256 * 1024 * 1024;
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// What the manifest says of an extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionManifest {
    pub name: String,
    pub version: String,
}

/// Why a zip is not a loadable extension (shown to the uploader).
pub use flotilla_api_types::extensions::ExtensionRefusal as Refusal;

/// Why an extension could not be unpacked into an instance's directory:
/// the zip is refused, or the node's disk failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("cannot create {}: {source}", .dest.display())]
    CreateDestination {
        dest: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A folder, or a file, of the extension.
    #[error("cannot create {entry}: {source}")]
    Create {
        entry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the folder of {entry}: {source}")]
    CreateFolderOf {
        entry: String,
        #[source]
        source: std::io::Error,
    },
    /// Reading the entry from the zip or writing it failed.
    #[error("cannot unpack {entry}: {source}")]
    Unpack {
        entry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {entry}: {source}")]
    Write {
        entry: String,
        #[source]
        source: std::io::Error,
    },
}

/// Checks that `zip` holds an unpacked Manifest V3 extension (its
/// `manifest.json` at the root or in the zip's one top-level folder) and
/// returns its name and version.
pub fn inspect(zip: &[u8]) -> Result<ExtensionManifest, Refusal> {
    inspect_within(zip, MAX_UNPACKED_BYTES)
}

fn inspect_within(zip: &[u8], max_unpacked: u64) -> Result<ExtensionManifest, Refusal> {
    let mut archive = open(zip)?;
    let layout = layout(&mut archive, max_unpacked)?;
    let mut budget = max_unpacked;
    for index in 0..archive.len() {
        let (mut entry, name) = entry_at(&mut archive, index)?;
        copy_within(&mut entry, &mut std::io::sink(), &mut budget, max_unpacked)
            .map_err(|e| e.unwrap_or_else(|source| Refusal::Damaged { name, source }))?;
    }
    let mut manifest = archive
        .by_index(layout.manifest)
        .map_err(|e| Refusal::ManifestUnreadable(e.into()))?;
    let mut text = Vec::new();
    (&mut manifest)
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(Refusal::ManifestUnreadable)?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(Refusal::ManifestTooLarge);
    }
    parse_manifest(&text)
}

/// Unpacks the extension in `zip` into `dest` (created: it must not exist,
/// its parent must), with the folder that holds `manifest.json` as `dest`
/// itself.
pub fn unpack(zip: &[u8], dest: &Path) -> Result<(), UnpackError> {
    unpack_within(zip, dest, MAX_UNPACKED_BYTES)
}

fn unpack_within(zip: &[u8], dest: &Path, max_unpacked: u64) -> Result<(), UnpackError> {
    let mut archive = open(zip)?;
    let layout = layout(&mut archive, max_unpacked)?;
    std::fs::create_dir(dest).map_err(|source| UnpackError::CreateDestination {
        dest: dest.to_owned(),
        source,
    })?;
    let mut budget = max_unpacked;
    for index in 0..archive.len() {
        let (mut entry, name) = entry_at(&mut archive, index)?;
        let Some(relative) = name.strip_prefix(&layout.prefix) else {
            continue;
        };
        let relative = relative.trim_end_matches('/');
        if relative.is_empty() {
            continue;
        }
        let target = dest.join(relative);
        if entry.is_dir() {
            std::fs::create_dir_all(&target).map_err(|source| UnpackError::Create {
                entry: relative.to_owned(),
                source,
            })?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|source| UnpackError::CreateFolderOf {
                entry: relative.to_owned(),
                source,
            })?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(|source| UnpackError::Create {
                entry: relative.to_owned(),
                source,
            })?;
        copy_within(&mut entry, &mut out, &mut budget, max_unpacked).map_err(|e| match e {
            Ok(refusal) => UnpackError::Refused(refusal),
            Err(source) => UnpackError::Unpack {
                entry: relative.to_owned(),
                source,
            },
        })?;
        out.flush().map_err(|source| UnpackError::Write {
            entry: relative.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Entry `index` of `archive` and its name.
fn entry_at<R: Read + std::io::Seek>(
    archive: &mut ZipArchive<R>,
    index: usize,
) -> Result<(zip::read::ZipFile<'_, R>, String), Refusal> {
    let entry = archive
        .by_index(index)
        .map_err(|e| Refusal::EntryUnreadable {
            index,
            source: e.into(),
        })?;
    let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
    Ok((entry, name))
}

/// Copies `entry` to `out` within what is left of the unpacked-size
/// `budget`: the refusal when it would go over, the I/O error (for the
/// caller to word) when reading or writing fails.
fn copy_within(
    entry: &mut impl Read,
    out: &mut impl Write,
    budget: &mut u64,
    max_unpacked: u64,
) -> Result<(), Result<Refusal, std::io::Error>> {
    let copied = std::io::copy(&mut entry.take(*budget + 1), out).map_err(Err)?;
    if copied > *budget {
        return Err(Ok(too_big(max_unpacked)));
    }
    *budget -= copied;
    Ok(())
}

fn too_big(max_unpacked: u64) -> Refusal {
    Refusal::UnpacksTooLarge {
        max_kib: max_unpacked / 1024,
    }
}

fn open(zip: &[u8]) -> Result<ZipArchive<Cursor<&[u8]>>, Refusal> {
    if zip.len() > MAX_ZIP_BYTES {
        return Err(Refusal::ZipTooLarge {
            max_mib: MAX_ZIP_BYTES / (1024 * 1024),
        });
    }
    // Every entry has a central directory header: more signatures than the
    // cap is refused before the directory is listed into memory.
    let headers = memchr::memmem::find_iter(zip, b"PK\x01\x02").count();
    if headers > MAX_ENTRIES {
        return Err(Refusal::TooManyEntries { max: MAX_ENTRIES });
    }
    let archive =
        ZipArchive::new(Cursor::new(zip)).map_err(|e| Refusal::NotZip(std::io::Error::from(e)))?;
    if archive.len() > MAX_ENTRIES {
        return Err(Refusal::TooManyEntries { max: MAX_ENTRIES });
    }
    // The zip crate keeps one entry per name: a name listed twice would be
    // gone before `layout` could see it. The directory's own count tells.
    match declared_entries(zip) {
        Some(declared) if declared == archive.len() => {}
        Some(declared) => {
            return Err(Refusal::DuplicateNames {
                declared,
                distinct: archive.len(),
            });
        }
        None => return Err(Refusal::NoEndOfDirectory),
    }
    Ok(archive)
}

/// The number of entries the end of central directory record declares
/// (the last one in the zip; a zip64 count, `0xFFFF`, is more than any
/// extension may have and is answered as such).
fn declared_entries(zip: &[u8]) -> Option<usize> {
    const END: &[u8] = b"PK\x05\x06";
    // The record is 22 bytes plus a comment of at most 65535.
    let tail_start = zip.len().saturating_sub(22 + 65_535);
    let at = tail_start + memchr::memmem::rfind(&zip[tail_start..], END)?;
    let total = zip.get(at + 10..at + 12)?;
    Some(usize::from(u16::from_le_bytes([total[0], total[1]])))
}

/// Where the extension is inside a checked zip.
struct Layout {
    /// `""` or `"<folder>/"`: what every unpacked name starts with.
    prefix: String,
    /// The index of `manifest.json`.
    manifest: usize,
}

/// Checks every entry's name and kind, and finds `manifest.json`: at the
/// root, or in the one folder that holds every entry.
fn layout(archive: &mut ZipArchive<Cursor<&[u8]>>, max_unpacked: u64) -> Result<Layout, Refusal> {
    let mut seen = HashSet::new();
    let mut declared: u64 = 0;
    let mut tops = HashSet::new();
    let mut root_manifest = None;
    let mut nested_manifests = Vec::new();
    for index in 0..archive.len() {
        let entry = archive
            .by_index_raw(index)
            .map_err(|e| Refusal::EntryUnreadable {
                index,
                source: e.into(),
            })?;
        let name = std::str::from_utf8(entry.name_raw())
            .map_err(|_| Refusal::NameNotUtf8 { index })?
            .to_owned();
        check_entry_name(&name)?;
        if entry.is_symlink() {
            return Err(Refusal::Link { name });
        }
        if entry.encrypted() {
            return Err(Refusal::Encrypted { name });
        }
        if !seen.insert(name.trim_end_matches('/').to_owned()) {
            return Err(Refusal::EntryTwice { name });
        }
        declared = declared.saturating_add(entry.size());
        if declared > max_unpacked {
            return Err(too_big(max_unpacked));
        }
        let (top, rest) = match name.split_once('/') {
            Some((top, rest)) => (top, rest),
            None => (name.as_str(), ""),
        };
        tops.insert(top.to_owned());
        if name == "manifest.json" {
            root_manifest = Some(index);
        } else if rest == "manifest.json" {
            nested_manifests.push((format!("{top}/"), index));
        }
    }
    if let Some(manifest) = root_manifest {
        return Ok(Layout {
            prefix: String::new(),
            manifest,
        });
    }
    match (tops.len(), nested_manifests.as_slice()) {
        (1, [(prefix, manifest)]) => Ok(Layout {
            prefix: prefix.clone(),
            manifest: *manifest,
        }),
        _ => Err(Refusal::NoManifest),
    }
}

/// A relative path of plain components: no absolute path, `.` or `..`,
/// empty component, backslash or control character.
fn check_entry_name(name: &str) -> Result<(), Refusal> {
    let body = name.strip_suffix('/').unwrap_or(name);
    let plain = !body.is_empty()
        && body.len() <= 1024
        && !body.starts_with('/')
        && !body.chars().any(|c| c == '\\' || c.is_control())
        && body
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if plain {
        Ok(())
    } else {
        Err(Refusal::NotPlainPath {
            name: name.to_owned(),
        })
    }
}

fn parse_manifest(text: &[u8]) -> Result<ExtensionManifest, Refusal> {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let manifest: Value = serde_json::from_slice(text).map_err(Refusal::ManifestNotJson)?;
    let Some(manifest) = manifest.as_object() else {
        return Err(Refusal::ManifestNotObject);
    };
    match manifest.get("manifest_version").and_then(Value::as_i64) {
        Some(3) => {}
        Some(2) => return Err(Refusal::ManifestV2),
        _ => return Err(Refusal::ManifestVersion),
    }
    let text_field = |field: &'static str| -> Result<String, Refusal> {
        match manifest.get(field).and_then(Value::as_str) {
            Some(value)
                if !value.trim().is_empty()
                    && value.chars().count() <= 200
                    && !value.chars().any(char::is_control) =>
            {
                Ok(value.to_owned())
            }
            _ => Err(Refusal::ManifestField { field }),
        }
    };
    let name = text_field("name")?;
    let version = text_field("version")?;
    if !valid_version(&version) {
        return Err(Refusal::Version { version });
    }
    Ok(ExtensionManifest { name, version })
}

/// Chromium's rule for `version`: `1`, `1.2`, `1.2.3` or `1.2.3.4`, each
/// part 0 to 65535 without a leading zero.
fn valid_version(version: &str) -> bool {
    let parts: Vec<&str> = version.split('.').collect();
    (1..=4).contains(&parts.len())
        && parts.iter().all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part.len() == 1 || !part.starts_with('0'))
                && part.parse::<u32>().is_ok_and(|n| n <= 65535)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    const MANIFEST: &str = r#"{"manifest_version": 3, "name": "Marker", "version": "1.2.3"}"#;

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        zip_with(SimpleFileOptions::default(), entries)
    }

    /// A zip of `entries` (a name ending in `/` is a folder), each written
    /// with `options`.
    fn zip_with(options: SimpleFileOptions, entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, content) in entries {
            if name.ends_with('/') {
                zip.add_directory(*name, options).unwrap();
            } else {
                zip.start_file(*name, options).unwrap();
                zip.write_all(content).unwrap();
            }
        }
        zip.finish().unwrap().into_inner()
    }

    #[test]
    fn a_manifest_at_the_root_or_in_one_folder_is_an_extension() {
        let expected = ExtensionManifest {
            name: "Marker".into(),
            version: "1.2.3".into(),
        };
        let root = zip_of(&[("manifest.json", MANIFEST.as_bytes()), ("a/b.js", b"1")]);
        assert_eq!(inspect(&root).unwrap(), expected.clone());
        let nested = zip_of(&[
            ("marker/", b""),
            ("marker/manifest.json", MANIFEST.as_bytes()),
            ("marker/content.js", b"document.title = 'x'"),
        ]);
        assert_eq!(inspect(&nested).unwrap(), expected);

        let dest = tempfile::tempdir().unwrap();
        let target = dest.path().join("ext");
        unpack(&nested, &target).unwrap();
        assert_eq!(
            std::fs::read_to_string(target.join("manifest.json")).unwrap(),
            MANIFEST
        );
        assert!(target.join("content.js").is_file());
        assert!(!target.join("marker").exists());
    }

    #[test]
    fn what_is_not_an_extension_is_refused_with_the_reason() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"not a zip at all".to_vec(), "not a zip"),
            (zip_of(&[("content.js", b"1")]), "no manifest.json"),
            (
                zip_of(&[("a/manifest.json", MANIFEST.as_bytes()), ("b/x.js", b"1")]),
                "no manifest.json",
            ),
            (zip_of(&[("manifest.json", b"{not json")]), "not valid JSON"),
            (
                zip_of(&[(
                    "manifest.json",
                    br#"{"manifest_version": 2, "name": "a", "version": "1"}"#,
                )]),
                "manifest_version 2",
            ),
            (
                zip_of(&[(
                    "manifest.json",
                    br#"{"manifest_version": 3, "version": "1"}"#,
                )]),
                "name",
            ),
            (
                zip_of(&[(
                    "manifest.json",
                    br#"{"manifest_version": 3, "name": "a", "version": "1.02"}"#,
                )]),
                "version",
            ),
        ];
        for (zip, expected) in cases {
            let refusal = inspect(&zip).unwrap_err().to_string();
            assert!(refusal.contains(expected), "{refusal:?} lacks {expected:?}");
        }
    }

    #[test]
    fn an_entry_listed_twice_is_refused() {
        // Written with two names, then the second renamed to the first in
        // its local header and in the central directory.
        let mut zip = zip_of(&[
            ("manifest.json", MANIFEST.as_bytes()),
            ("content.js", b"first"),
            ("content.jz", b"second"),
        ]);
        let mut renamed = 0;
        while let Some(at) = memchr::memmem::find(&zip, b"content.jz") {
            zip[at + 9] = b's';
            renamed += 1;
        }
        assert_eq!(renamed, 2, "local header and central directory");
        let refusal = inspect(&zip).unwrap_err().to_string();
        assert!(refusal.contains("appears twice"), "{refusal}");
        let dest = tempfile::tempdir().unwrap();
        assert!(unpack(&zip, &dest.path().join("ext")).is_err());
    }

    #[test]
    fn hostile_entry_names_are_refused() {
        for name in [
            "../evil.js",
            "a/../../evil.js",
            "/etc/evil",
            "a\\..\\evil.js",
            "a//b.js",
            "./a.js",
            "a\nb.js",
        ] {
            let zip = zip_of(&[("manifest.json", MANIFEST.as_bytes()), (name, b"1")]);
            let refusal = inspect(&zip).unwrap_err().to_string();
            assert!(
                refusal.contains("plain relative path"),
                "{name:?}: {refusal}"
            );
            let dest = tempfile::tempdir().unwrap();
            assert!(unpack(&zip, &dest.path().join("ext")).is_err());
        }
    }

    #[test]
    fn links_are_refused() {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        zip.start_file("manifest.json", SimpleFileOptions::default())
            .unwrap();
        zip.write_all(MANIFEST.as_bytes()).unwrap();
        zip.add_symlink("content.js", "/etc/shadow", SimpleFileOptions::default())
            .unwrap();
        let zip = zip.finish().unwrap().into_inner();
        assert!(inspect(&zip).unwrap_err().to_string().contains("link"));
    }

    #[test]
    fn a_zip_bomb_stops_at_the_unpacked_limit() {
        // Deflate makes zeros tiny: the cap holds on sizes, not on the wire.
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let zeros = vec![0u8; 2 * 1024 * 1024];
        let zip = zip_with(
            options,
            &[
                ("manifest.json", MANIFEST.as_bytes()),
                ("zeros.bin", &zeros),
            ],
        );
        assert!(zip.len() < 64 * 1024, "{} bytes", zip.len());
        let limit = 1024 * 1024;
        let refusal = inspect_within(&zip, limit).unwrap_err().to_string();
        assert!(refusal.contains("more than 1024 KiB"), "{refusal}");
        let dest = tempfile::tempdir().unwrap();
        assert!(unpack_within(&zip, &dest.path().join("ext"), limit).is_err());
        assert!(inspect(&zip).is_ok(), "within the real limit");
    }

    #[test]
    fn a_damaged_entry_is_refused_at_upload() {
        let stored =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let mut zip = zip_with(
            stored,
            &[
                ("manifest.json", MANIFEST.as_bytes()),
                ("a.js", b"console.log(1)"),
            ],
        );
        // Flip a byte of a.js's stored data: its CRC no longer matches.
        let at = zip
            .windows(b"console.log(1)".len())
            .position(|w| w == b"console.log(1)")
            .unwrap();
        zip[at] ^= 0x20;
        let refusal = inspect(&zip).unwrap_err().to_string();
        assert!(refusal.contains("damaged"), "{refusal}");
    }

    #[test]
    fn too_many_entries_are_refused_before_listing_them() {
        let mut zip = zip_of(&[("manifest.json", MANIFEST.as_bytes())]);
        zip.extend(std::iter::repeat_n(b"PK\x01\x02".as_slice(), MAX_ENTRIES).flatten());
        let refusal = inspect(&zip).unwrap_err().to_string();
        assert!(refusal.contains("more than 10000 entries"), "{refusal}");
    }

    #[test]
    fn versions_follow_chromiums_rule() {
        for good in ["1", "1.0", "0.1.2.3", "65535.0"] {
            assert!(valid_version(good), "{good}");
        }
        for bad in [
            "",
            "1.",
            ".1",
            "1.2.3.4.5",
            "01",
            "65536",
            "1.a",
            "-1",
            "1 .2",
        ] {
            assert!(!valid_version(bad), "{bad}");
        }
    }
}
