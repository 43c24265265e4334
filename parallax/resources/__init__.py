"""The cluster a job runs on: its frozen description (:mod:`.cluster`) and the
readers that make it from a resource file (:mod:`.files`), role specs
(:mod:`.rolespec`) and a Slurm allocation (:mod:`.slurm`).
"""
