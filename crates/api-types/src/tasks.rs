//! Operations that must not be cut short by a caller that goes away.

/// Runs `operation` in a task of its own and waits for it: dropping the wait
/// (an HTTP client that hangs up, a control plane that dies mid-call) does not
/// cancel the operation, so a browser is never left half-stopped or a park
/// half-recorded. A panic in the operation is raised again here.
pub async fn to_completion<T: Send + 'static>(
    operation: impl Future<Output = T> + Send + 'static,
) -> T {
    match tokio::spawn(operation).await {
        Ok(outcome) => outcome,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_abandoned_operation_still_finishes() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let waiting = tokio::spawn(to_completion(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            flag.store(true, Ordering::SeqCst);
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        waiting.abort();
        for _ in 0..100 {
            if finished.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the operation was cancelled with its caller");
    }
}
