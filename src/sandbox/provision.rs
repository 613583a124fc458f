//! Image provisioning: every image a BAE profile declares (`available_sandboxes`) is made
//! ready by the driver (`ensure_image`: for Docker an inspect, else a pull) on one background
//! thread (`kestrel-provision`), so neither the admin call that declared it nor the start of
//! the server waits on a registry. Each image has a status: `pending` until its turn has
//! come and gone (also for an image never asked about), then `available` or `error` with the
//! driver's words.
//!
//! An image is provisioned once per process: asking again for an available or pending image
//! does nothing, asking again for one that failed tries it again (so replacing a profile
//! retries its failed images). The status is process memory; at start every live profile's
//! images are asked for again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_channel::{unbounded, Sender};

use super::Driver;

/// Where an image stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageState {
    Pending,
    Available,
    /// The driver's detail.
    Error(String),
}

impl ImageState {
    /// The wire name: `pending`, `available` or `error`.
    pub fn name(&self) -> &'static str {
        match self {
            ImageState::Pending => "pending",
            ImageState::Available => "available",
            ImageState::Error(_) => "error",
        }
    }

    pub fn detail(&self) -> Option<&str> {
        match self {
            ImageState::Error(detail) => Some(detail),
            _ => None,
        }
    }
}

type States = Arc<Mutex<HashMap<String, ImageState>>>;

/// The provisioner: its thread ends once this is dropped and its queue is drained.
pub struct Images {
    states: States,
    queue: Sender<String>,
    /// The driver has no images: each is available as soon as it is asked for.
    imageless: bool,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images").field("known", &self.lock_len()).finish()
    }
}

impl Images {
    /// Starts the provisioning thread for `driver`. If no thread can be started, every image
    /// asked for is an error that says so.
    pub fn start(driver: Arc<dyn Driver>) -> Images {
        let states: States = Arc::default();
        let imageless = !driver.has_images();
        let (queue, images) = unbounded::<String>();
        let shared = Arc::clone(&states);
        let spawned = std::thread::Builder::new().name("kestrel-provision".into()).spawn(move || {
            for image in images {
                let state = match driver.ensure_image(&image, &crossbeam_channel::never()) {
                    Ok(()) => {
                        log::info!("sandbox image {image:?} is available");
                        ImageState::Available
                    }
                    Err(error) => {
                        log::warn!("sandbox image {image:?} could not be provisioned: {error}");
                        ImageState::Error(error.0)
                    }
                };
                shared.lock().unwrap_or_else(PoisonError::into_inner).insert(image, state);
            }
        });
        if let Err(error) = spawned {
            log::error!("sandbox images cannot be provisioned: no thread: {error}");
        }
        Images { states, queue, imageless }
    }

    /// Queues the images that are neither available nor already queued.
    pub fn provision<'a>(&self, images: impl IntoIterator<Item = &'a String>) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        for image in images {
            if matches!(states.get(image), Some(ImageState::Available | ImageState::Pending)) {
                continue;
            }
            if self.imageless {
                states.insert(image.clone(), ImageState::Available);
                continue;
            }
            states.insert(image.clone(), ImageState::Pending);
            if self.queue.send(image.clone()).is_err() {
                states.insert(image.clone(), ImageState::Error("the provisioning thread has stopped".into()));
            }
        }
    }

    /// An image's status; one never asked about is pending.
    pub fn state(&self, image: &str) -> ImageState {
        let states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states.get(image).cloned().unwrap_or(ImageState::Pending)
    }

    fn lock_len(&self) -> usize {
        self.states.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{DriverError, Ending, Running, Script};
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// A driver whose `ensure_image` waits for the test's go-ahead, and fails for `bad:*`.
    struct Gated {
        go: crossbeam_channel::Receiver<()>,
        asked: Mutex<Vec<String>>,
    }

    impl Driver for Gated {
        fn ensure_image(&self, image: &str, _: &crossbeam_channel::Receiver<()>) -> Result<(), DriverError> {
            self.asked.lock().unwrap().push(image.to_string());
            let _ = self.go.recv();
            match image.starts_with("bad:") {
                true => Err(DriverError("manifest unknown".into())),
                false => Ok(()),
            }
        }
        fn start(&self, _: &str, _: &crossbeam_channel::Receiver<()>) -> Result<Running, DriverError> {
            unreachable!()
        }
        fn stop(&self, _: &Running) -> Result<(), DriverError> {
            unreachable!()
        }
        fn process(&self, _: &Running, _: &Script<'_>) -> Result<Command, DriverError> {
            unreachable!()
        }
        fn reap(&self, _: &Running, _: &str, _: Ending) {
            unreachable!()
        }
        fn isolated(&self) -> bool {
            true
        }
    }

    fn settled(images: &Images, image: &str) -> ImageState {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = images.state(image);
            if state != ImageState::Pending || Instant::now() > deadline {
                return state;
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn images_are_pending_until_the_driver_answers_and_a_failed_one_is_retried() {
        let (go, gate) = crossbeam_channel::unbounded();
        let driver = Arc::new(Gated { go: gate, asked: Mutex::default() });
        let images = Images::start(driver.clone());
        assert_eq!(images.state("never:asked"), ImageState::Pending);
        let (good, bad) = ("good:1".to_string(), "bad:1".to_string());
        images.provision([&good, &bad, &good]);
        assert_eq!(images.state("good:1"), ImageState::Pending, "nothing answered yet");
        go.send(()).unwrap();
        go.send(()).unwrap();
        assert_eq!(settled(&images, "good:1"), ImageState::Available);
        assert_eq!(settled(&images, "bad:1"), ImageState::Error("manifest unknown".into()));
        images.provision([&good, &bad]);
        go.send(()).unwrap();
        assert_eq!(settled(&images, "bad:1"), ImageState::Error("manifest unknown".into()));
        let asked = driver.asked.lock().unwrap().clone();
        assert_eq!(asked, ["good:1", "bad:1", "bad:1"], "an available image is not asked for again");
    }
}
