//! WebDriver with the clients users run, unchanged: Selenium 4 for Python
//! against `/wd/hub` (the API key in the URL, as Selenium carries it), and
//! the W3C wire itself for what a client library hides (errors, ownership,
//! a session whose instance is parked and revived by its next command).

use serde_json::{Value, json};

use flotilla_testkit::{
    Api, BROWSER_DEADLINE, PageServer, StatusCode, TestServe, run_python, spawn_serve_with_page,
};

const KEY: &str = "webdriver-key-0123456789";
const OTHER_KEY: &str = "another-webdriver-key";

const FORM: &str = "<title>form</title><input id=name><select id=color><option value=red>red</option>\
<option value=blue>blue</option></select><button id=go onclick=\"document.getElementById('out').textContent=\
'Hello '+document.getElementById('name').value+' in '+document.getElementById('color').value\">go</button>\
<p id=out></p><iframe name=inner srcdoc='<p>in the frame</p>'></iframe>";

async fn serve() -> (PageServer, TestServe) {
    let (site, mut serve) = spawn_serve_with_page(FORM, |config| {
        config.control.auth_enabled = true;
        config.control.api_keys = vec![KEY.into(), OTHER_KEY.into()];
    })
    .await;
    serve.api = Api::with_key(serve.api.base.clone(), KEY);
    (site, serve)
}

/// A W3C call with `key` (none: no credential): status and JSON.
async fn w3c(
    serve: &TestServe,
    key: Option<&str>,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", serve.api.base));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn w3c_error(answer: &(StatusCode, Value)) -> &str {
    answer.1["value"]["error"].as_str().unwrap_or("")
}

#[tokio::test]
async fn browser_selenium_for_python_drives_an_instance_through_wd_hub() {
    let (site, serve) = serve().await;
    let port = serve.api.base.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://flotilla:{KEY}@127.0.0.1:{port}/wd/hub");
    // Two sessions at once.
    let args = [remote.as_str(), site.base.as_str()];
    let (first, second) = tokio::join!(
        run_python("selenium_suite.py", &args),
        run_python("selenium_suite.py", &args),
    );
    for seen in [first.unwrap(), second.unwrap()] {
        assert_eq!(seen["title"], "form", "{seen}");
        assert_eq!(seen["greeting"], "Hello Ada in blue", "{seen}");
        assert_eq!(seen["script"], 42);
        assert_eq!(seen["async_script"], "later");
        assert_eq!(seen["alert"], "attention");
        assert_eq!(seen["frame"], "in the frame");
        assert_eq!(seen["windows"], 2);
        assert_eq!(seen["other_title"], "form");
        assert_eq!(seen["cookie"], "oatmeal");
        assert_eq!(seen["screenshot"]["png"], true);
        assert_eq!(seen["size"], json!({"width": 800, "height": 600}), "{seen}");
        assert_eq!(seen["initial_size"]["width"], 1024, "{seen}");
        assert_eq!(seen["cdp"], 3);
        let caps = &seen["capabilities"];
        assert_eq!(caps["browserName"], "chrome", "{caps}");
        assert!(
            caps["se:cdp"].as_str().unwrap().contains("/cdp?token="),
            "{caps}"
        );
        assert!(
            caps["goog:chromeOptions"].get("debuggerAddress").is_none(),
            "{caps}"
        );
        // The session was an instance; quitting deleted it.
        let id = seen["session"].as_str().unwrap();
        let (status, _) = serve.api.get(&format!("/v2/instances/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "quit deletes the instance");
    }
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_webdriver_refusals_are_w3c_errors_and_sessions_belong_to_their_key() {
    let (site, serve) = serve().await;
    use reqwest::Method;
    // No credential: 401 in WebDriver's shape, asking for Basic.
    let refused = w3c(
        &serve,
        None,
        Method::POST,
        "/session",
        Some(json!({"capabilities": {}})),
    )
    .await;
    assert_eq!(refused.0, StatusCode::UNAUTHORIZED);
    assert!(
        refused.1["value"]["message"]
            .as_str()
            .unwrap()
            .contains("API key"),
        "{:?}",
        refused.1
    );
    // Malformed bodies and capabilities.
    for (body, code) in [
        (json!("nope"), "invalid argument"),
        (
            json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": ["--no-sandbox"]}}}}),
            "invalid argument",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"browserName": "firefox"}}}),
            "session not created",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"browserVersion": "1"}}}),
            "session not created",
        ),
        (
            json!({"capabilities": {"alwaysMatch": {"timeouts": {"implicit": "soon"}}}}),
            "invalid argument",
        ),
    ] {
        let answer = w3c(
            &serve,
            Some(KEY),
            Method::POST,
            "/session",
            Some(body.clone()),
        )
        .await;
        assert_eq!(w3c_error(&answer), code, "{body}: {:?}", answer.1);
    }
    let (status, list) = serve.api.get("/v2/instances").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        list["total"], 0,
        "a refused session leaves no instance: {list}"
    );

    // A session; another key's request about it is an unknown session.
    let created = w3c(
        &serve,
        Some(KEY),
        Method::POST,
        "/session",
        Some(json!({"capabilities": {}})),
    )
    .await;
    assert_eq!(created.0, StatusCode::OK, "{:?}", created.1);
    let id = created.1["value"]["sessionId"].as_str().unwrap().to_owned();
    let url = format!("/session/{id}/url");
    let page = json!({"url": format!("{}/", site.base)});
    let theirs = w3c(
        &serve,
        Some(OTHER_KEY),
        Method::POST,
        &url,
        Some(page.clone()),
    )
    .await;
    assert_eq!(w3c_error(&theirs), "invalid session id", "{:?}", theirs.1);
    assert_eq!(theirs.0, StatusCode::NOT_FOUND);
    let made_up = w3c(
        &serve,
        Some(KEY),
        Method::GET,
        "/session/0193d6a4-0000-7000-8000-000000000001/title",
        None,
    )
    .await;
    assert_eq!(w3c_error(&made_up), "invalid session id");
    // A path that tries to climb out reaches only chromedriver, which knows
    // no such command.
    let traversal = w3c(
        &serve,
        Some(KEY),
        Method::GET,
        &format!("/session/{id}/..%2f..%2fv2%2finstances"),
        None,
    )
    .await;
    assert_eq!(
        w3c_error(&traversal),
        "unknown command",
        "{:?}",
        traversal.1
    );
    let navigated = w3c(&serve, Some(KEY), Method::POST, &url, Some(page)).await;
    assert_eq!(navigated.0, StatusCode::OK, "{:?}", navigated.1);

    // Parked (its idle timeout, or the API): the next command revives it.
    serve.api.park(&id).await;
    serve
        .api
        .wait_for_status(&id, "dormant", BROWSER_DEADLINE)
        .await;
    let title = w3c(
        &serve,
        Some(KEY),
        Method::GET,
        &format!("/session/{id}/title"),
        None,
    )
    .await;
    assert_eq!(title.0, StatusCode::OK, "{:?}", title.1);
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;

    // Deleting its instance ends the session.
    serve.api.delete_instance(&id).await;
    let gone = w3c(
        &serve,
        Some(KEY),
        Method::GET,
        &format!("/session/{id}/title"),
        None,
    )
    .await;
    assert_eq!(w3c_error(&gone), "invalid session id");

    // Grid's status, open.
    let status = w3c(&serve, None, Method::GET, "/wd/hub/status", None).await;
    assert_eq!(status.0, StatusCode::OK);
    assert_eq!(status.1["value"]["ready"], true, "{:?}", status.1);
    serve.shutdown().await;
}
