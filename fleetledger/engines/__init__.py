"""What serves generations: engines that implement the controller's ``GenerationShard``
interface inside a Ray actor and join the refit communicator as its members."""
