//! The Kubernetes manifests (`deploy/kubernetes`), checked offline: each
//! overlay renders with `kubectl kustomize`, every object it renders (and
//! the examples) validates against a current Kubernetes schema
//! (`kubernetes-validate --strict`, PyPI), and `yamllint` passes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Runs `program args…`: its stdout, or a failure naming what to install.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            panic!("{program} cannot run ({error}): scripts/install-deps --test installs it")
        });
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_kubernetes_overlays_render_and_validate() {
    let out = tempfile::tempdir().unwrap();
    for overlay in ["single-node", "cluster"] {
        let dir = deploy_dir().join("overlays").join(overlay);
        let rendered = run("kubectl", &["kustomize", &dir.to_string_lossy()]);
        let kinds: Vec<&str> = rendered
            .lines()
            .filter_map(|line| line.strip_prefix("kind: "))
            .collect();
        for kind in [
            "Namespace",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "DaemonSet",
            "StatefulSet",
            "Ingress",
            "ServiceMonitor",
        ] {
            assert!(kinds.contains(&kind), "{overlay}: no {kind} in {kinds:?}");
        }
        let file = out.path().join(format!("{overlay}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        run(
            "kubernetes-validate",
            &["--strict", "--quiet", &file.to_string_lossy()],
        );
    }
    let example = deploy_dir().join("examples/autoscaling.yaml");
    run(
        "kubernetes-validate",
        &["--strict", "--quiet", &example.to_string_lossy()],
    );
}

#[test]
fn the_kubernetes_manifests_pass_yamllint() {
    let dir = deploy_dir();
    let config = dir.join(".yamllint");
    run(
        "yamllint",
        &[
            "--strict",
            "-c",
            &config.to_string_lossy(),
            &dir.to_string_lossy(),
        ],
    );
}

#[test]
fn a_manifest_that_is_not_valid_is_caught() {
    // The check itself: a Deployment with a field Kubernetes does not have.
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: two\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: c, image: i}]\n",
    )
    .unwrap();
    let status = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", &file.to_string_lossy()])
        .output()
        .expect("kubernetes-validate runs (scripts/install-deps --test)")
        .status;
    assert!(!status.success(), "replicas: two passed validation");
}
