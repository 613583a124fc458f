//! The answer to a slow step's caller, which its session's actor gives once it no longer
//! counts the step (`session.rs`, `Done::Files`).

/// A caller's answer, given when the actor takes it, or when it is dropped unread (the actor
/// retired after a delete before it read its `Done`): never lost.
pub(crate) struct Answer(Option<Box<dyn FnOnce() + Send>>);

impl Answer {
    pub(crate) fn new(answer: impl FnOnce() + Send + 'static) -> Answer {
        Answer(Some(Box::new(answer)))
    }

    pub(crate) fn give(mut self) {
        if let Some(answer) = self.0.take() {
            answer();
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer();
        }
    }
}
