//! The node's memory under maximal screenshots (issue 26): a token holder
//! sets a 6000×6000 viewport at device scale 2 (144 million pixels) and asks
//! for eight screenshots at once.
//!
//!   capture_bench [--binary target/release/flotilla] [--before OLD_BINARY]
//!
//! For each binary (the build under test, and with `--before` the build
//! before the capture limits, in the same run): `flotilla serve` with one
//! instance showing a page of text, then one of coarse noise, drawn on
//! every device pixel of the viewport overridden over CDP; eight concurrent
//! `GET /screenshot` on its HTTP port. Reported: the serve process's RSS
//! before, its peak while the captures run (sampled every 20 ms), and 2 s
//! and 10 s after; the answers' statuses and the PNG size.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;

use flotilla_bench::{ServeProcess, Tab, create_running, rss_kib, text_flag};

/// Two pages, each drawn on every device pixel once the viewport is
/// overridden (`draw()`): text on a gradient (what pages look like: about
/// 10 MB as PNG at full size), and coarse noise (the worst case: a PNG that
/// does not compress, as the report's 108 MB screenshot).
const PAGES: [(&str, &str); 2] = [
    (
        "text",
        "data:text/html,<title>capture</title><style>body{margin:0;font:14px sans-serif;\
background:linear-gradient(135deg,%23fde,%23def 40%25,%23efd)}p{margin:4px}</style><body><script>\
function draw(){for(let i=0;i<4000;i++){const p=document.createElement('p');p.textContent='Line '+i+\
': the quick brown fox jumps over the lazy dog, '.repeat(8);p.style.color='hsl('+(i*37%25360)+',60%25,35%25)';\
document.body.append(p)}return true}</script>",
    ),
    (
        "noise",
        "data:text/html,<title>capture</title><style>body{margin:0}canvas{display:block;width:100vw;height:100vh}</style>\
<body><canvas id=c></canvas><script>function draw(){const c=document.getElementById('c');\
c.width=innerWidth*devicePixelRatio;c.height=innerHeight*devicePixelRatio;const g=c.getContext('2d');\
const rows=256;const d=g.createImageData(c.width,rows);const r=new Uint8Array(65536);\
for(let y=0;y<c.height;y+=rows){for(let i=0;i<d.data.length;i+=65536){crypto.getRandomValues(r);\
for(let j=0;j<65536&&i+j<d.data.length;j++)d.data[i+j]=((i+j)%254==3)?255:(r[j]&0xC0)}g.putImageData(d,0,y)}\
return true}</script>",
    ),
];

struct Figures {
    before_mib: f64,
    peak_mib: f64,
    after_2s_mib: f64,
    after_10s_mib: f64,
    statuses: Vec<u16>,
    png_bytes: Vec<usize>,
    elapsed_s: f64,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The id of the tab titled `title`, from the instance's `/tabs`.
async fn tab_titled(http: &reqwest::Client, http_port: u64, title: &str) -> anyhow::Result<String> {
    let tabs: serde_json::Value = http
        .get(format!("http://127.0.0.1:{http_port}/tabs"))
        .send()
        .await?
        .json()
        .await?;
    Ok(tabs
        .as_array()
        .and_then(|tabs| tabs.iter().find(|t| t["title"] == title))
        .and_then(|t| t["id"].as_str())
        .context("the tab")?
        .to_owned())
}

/// One serve of `binary`: its memory around eight maximal captures.
async fn measure(binary: &std::path::Path, page: &str) -> anyhow::Result<Figures> {
    let data = tempfile::tempdir()?;
    let serve = ServeProcess::start(binary, data.path(), None).await?;
    let pid = serve.child.id().context("serve pid")?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let created = create_running(
        &http,
        &serve.url,
        r#"{"config": {"memory_gb": 8}}"#,
        Duration::from_millis(50),
    )
    .await?;
    let debug = created["urls"]["debug"].as_str().context("urls.debug")?;
    let http_port = created["http_port"].as_u64().context("http_port")?;
    let tab = Tab::open(debug).await?;
    tab.load(page).await?;
    let tab_id = tab_titled(&http, http_port, "capture").await?;
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 6000, "height": 6000, "deviceScaleFactor": 2, "mobile": false}),
    )
    .await?;
    tab.eval("draw()").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_mib = mib(rss_kib(pid));
    let url = format!("http://127.0.0.1:{http_port}/screenshot?tab={tab_id}");
    let started = Instant::now();
    let captures = futures_util::future::join_all((0..8).map(|_| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let response = http.get(&url).send().await?;
            let status = response.status().as_u16();
            let body = response.bytes().await?;
            anyhow::Ok((status, body.len()))
        }
    }));
    tokio::pin!(captures);
    let mut peak = rss_kib(pid);
    let answers = loop {
        tokio::select! {
            answers = &mut captures => break answers,
            () = tokio::time::sleep(Duration::from_millis(20)) => peak = peak.max(rss_kib(pid)),
        }
    };
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut statuses = Vec::new();
    let mut png_bytes = Vec::new();
    for answer in answers {
        let (status, bytes) = answer?;
        statuses.push(status);
        if status == 200 {
            png_bytes.push(bytes);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_2s_mib = mib(rss_kib(pid));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after_10s_mib = mib(rss_kib(pid));
    drop(tab);
    serve.stop().await;
    Ok(Figures {
        before_mib,
        peak_mib: mib(peak),
        after_2s_mib,
        after_10s_mib,
        statuses,
        png_bytes,
        elapsed_s,
    })
}

fn row(name: &str, page: &str, figures: &Figures) -> String {
    let largest = figures.png_bytes.iter().max().copied().unwrap_or(0);
    format!(
        "| {name} | {page} | {:.0} | {:.0} | {:.0} | {:.0} | {:?} | {:.1} | {:.1} |",
        figures.before_mib,
        figures.peak_mib,
        figures.after_2s_mib,
        figures.after_10s_mib,
        figures.statuses,
        largest as f64 / (1024.0 * 1024.0),
        figures.elapsed_s,
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let before = text_flag("--before", "")?;
    println!(
        "| build | page | RSS before MiB | peak MiB | after 2 s MiB | after 10 s MiB | statuses | largest PNG MiB | all answered in s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, page) in PAGES {
        if !before.is_empty() {
            let figures = measure(std::path::Path::new(&before), page).await?;
            println!("{}", row("before (no capture limits)", name, &figures));
        }
        let figures = measure(&binary, page).await?;
        println!("{}", row("this build", name, &figures));
    }
    Ok(())
}
